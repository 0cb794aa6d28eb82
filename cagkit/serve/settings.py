"""What `cagkit serve` is started with (`ServeConfig`); imports nothing heavy, so `cagkit serve --help` is quick."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cagkit.config import DEFAULT_MODEL, DEFAULT_STORE
from cagkit.errors import CagkitError

DEFAULT_CACHE_BYTES = 2 << 30  # about eight 4k-token documents of qwen-1.5b placed in fp32


def parse_bytes(text: str) -> int:
    """A size such as `2G`, `512M`, `64k` or `1000000` (powers of 1024 for the suffixes) in bytes; a CagkitError
    that names the value otherwise."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    value = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = value[-1:] if value[-1:] in units and value[-1:] else ""
    try:
        number = float(value[:-1] if unit else value)
    except ValueError:
        raise CagkitError(f"--cache-bytes {text!r} is not a size; give bytes, or a number with K, M or G "
                          f"(e.g. 2G, 512M, 0 to keep none)") from None
    if number < 0:
        raise CagkitError(f"--cache-bytes must be 0 (keep none) or more, got {text}")
    return int(number * units[unit])


@dataclass(frozen=True)
class ServeConfig:
    """One server: its store, where it listens, the models it serves and who may call it.

    store: the store every request reads and every ingest writes; it may not exist yet (POST /v1/ingest
        creates it).
    host, port: where to listen; 127.0.0.1 answers this machine only (0.0.0.0 would answer the network).
    models: the model names requests may ask for (aliases, Hugging Face ids or model directories), the first
        `max_loaded` of them loaded at start.
    max_loaded: the most models kept in memory at once; a request for another unloads the least recently used.
    api_key: when set, every /v1 request must send `Authorization: Bearer <api_key>` (/health and /metrics stay
        open, as in vLLM).
    device: where the models run (`cagkit.models.loading.resolve_device`).
    cache_bytes: the most bytes of placed document contexts kept in memory, least recently used dropped first,
        so that another question on the same documents pays only its own prefill (`cagkit.kv.warm`); 0 keeps none.
    """

    store: Path = DEFAULT_STORE
    host: str = "127.0.0.1"
    port: int = 8000
    models: tuple[str, ...] = (DEFAULT_MODEL,)
    max_loaded: int = 2
    api_key: str | None = None
    device: str | None = None
    cache_bytes: int = DEFAULT_CACHE_BYTES

    def check(self) -> None:
        """Refuse a configuration the server could not run with, before any model loads or the port is bound: a
        --store that is a file, or a folder holding other things than a store, is refused as by every command."""
        if not self.models or any(not m.strip() for m in self.models):
            raise CagkitError(f"--models {','.join(self.models)}: name at least one model, e.g. --models smollm2,gemma")
        if len(set(self.models)) != len(self.models):
            raise CagkitError(f"--models {','.join(self.models)} names a model twice; name each once")
        if self.max_loaded < 1:
            raise CagkitError(f"--max-loaded must be at least 1, got {self.max_loaded}")
        if not 0 <= self.port <= 65535:
            raise CagkitError(f"--port must be between 0 and 65535, got {self.port}")
        if self.cache_bytes < 0:
            raise CagkitError(f"--cache-bytes must be 0 (keep none) or more, got {self.cache_bytes}")
        if self.api_key is not None and not self.api_key.strip():
            raise CagkitError("--api-key is empty; give a key, or leave the option out to serve without one")
        from cagkit.store.store import check_location

        check_location(self.store)
