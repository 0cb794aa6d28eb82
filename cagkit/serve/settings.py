"""What `cagkit serve` is started with (`ServeConfig`); imports nothing heavy, so `cagkit serve --help` is quick."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cagkit.config import DEFAULT_MODEL, DEFAULT_STORE
from cagkit.errors import CagkitError


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
    """

    store: Path = DEFAULT_STORE
    host: str = "127.0.0.1"
    port: int = 8000
    models: tuple[str, ...] = (DEFAULT_MODEL,)
    max_loaded: int = 2
    api_key: str | None = None
    device: str | None = None

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
        if self.api_key is not None and not self.api_key.strip():
            raise CagkitError("--api-key is empty; give a key, or leave the option out to serve without one")
        from cagkit.store.store import check_location

        check_location(self.store)
