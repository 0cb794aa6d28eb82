"""Prefill a model and capture its per-layer KV with RoPE removed (`ChunkKV`), alone, in a batch, after the
target's attention sink, or a document part after part as the model reads it (`DocumentPrefill`); and prefill a
target-native prefix into a cache shaped by the model's config.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from transformers import DynamicCache

from cagkit.kv.chunk import ChunkKV
from cagkit.kv.rope import RotaryTables, apply_rope, remove_rope
from cagkit.models.architecture import decoder_stack
from cagkit.models.device import model_device
from cagkit.models.loading import LoadedModel


class _StopForward(Exception):
    pass


@torch.no_grad()
def prefill_kv(model, input_ids: list[int], tables: RotaryTables | None = None, layers: int | None = None) -> ChunkKV:
    """Prefill `input_ids` alone at positions 0..T-1 and return every layer's KV with RoPE removed (fp32, on the
    model's device).

    A config-less DynamicCache keeps every token of every layer (sliding-window layers included, whose attention
    the mask still limits), so nothing of a long chunk is dropped. With `layers`, only the bottom `layers` layers
    run (a partial prefill costs about layers / L of a full one) and only their KV is returned.
    """
    tables = tables or RotaryTables(model)
    device = model_device(model)
    ids = torch.tensor([input_ids], dtype=torch.long, device=device)
    cache = DynamicCache()
    decoder = decoder_stack(model)
    total = len(decoder.layers)
    if layers is not None and layers < 1:
        raise ValueError(f"a partial prefill needs at least one layer, got {layers}")
    hook = None
    if layers is not None and layers < total:
        def stop(*_):
            raise _StopForward

        hook = decoder.layers[layers - 1].register_forward_hook(stop)
    try:
        decoder(input_ids=ids, cache=cache, use_cache=True)
    except _StopForward:
        pass
    finally:
        if hook is not None:
            hook.remove()
    keys, values = _rope_free(cache, tables, len(input_ids), device)
    return ChunkKV(keys[0], values[0])


def _rope_free(cache: DynamicCache, tables: RotaryTables, length: int, device, start: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every cached layer's keys of positions start..length-1 (cache entries of the same index) with RoPE removed
    and their values, in fp32: [B, L, T, H, D] each."""
    positions = torch.arange(start, length, device=device)
    keys, values = [], []
    for layer, cached in enumerate(cache.layers):
        cos, sin = tables(layer, positions)
        k = cached.keys[:, :, start:].transpose(1, 2).float()  # [B, H, T, D] -> [B, T, H, D]
        keys.append(remove_rope(k, cos, sin))  # cos, sin [T, D] broadcast over the batch
        values.append(cached.values[:, :, start:].transpose(1, 2).float())
    return torch.stack(keys, 1), torch.stack(values, 1)


@torch.no_grad()
def prefill_kv_batch(model, sequences: list[list[int]], tables: RotaryTables | None = None) -> list[ChunkKV]:
    """`prefill_kv` of several token sequences in one forward pass: each is right-padded to the longest and
    masked, so its tokens (which never attend to the padding after them) get the KV of its own prefill, up to
    rounding. One pass instead of one per sequence is what makes ingest fast on a GPU, where a 256-token prefill
    is mostly kernel launches."""
    if len(sequences) == 1:
        return [prefill_kv(model, sequences[0], tables)]
    if not sequences or min(len(s) for s in sequences) == 0:
        raise ValueError("prefill_kv_batch needs at least one sequence, none of them empty")
    tables = tables or RotaryTables(model)
    device = model_device(model)
    longest = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), longest, dtype=torch.long, device=device)
    mask = torch.zeros(len(sequences), longest, dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long, device=device)
        mask[row, : len(seq)] = 1
    cache = DynamicCache()
    decoder_stack(model)(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    keys, values = _rope_free(cache, tables, longest, device)  # [B, L, T, H, D]
    return [ChunkKV(keys[row, :, : len(seq)], values[row, :, : len(seq)]) for row, seq in enumerate(sequences)]


@torch.no_grad()
def prefix_cache(model, prefix_ids: list[int]) -> DynamicCache:
    """The target-native prefix (chat header, BOS) prefilled into a cache shaped by the model's config.

    The prefix is the same for every question, so its KV is computed once per model and prefix (the decoder
    alone: no LM head over its tokens) and each call gets a cache of its own holding a copy."""
    return copy_prefix(DynamicCache(config=model.config), model, prefix_ids)


def copy_prefix(cache: DynamicCache, model, prefix_ids: list[int]) -> DynamicCache:
    """`cache` (empty) with a copy of the prefix's KV from the per-model memo (`shared_prefix`) in every layer."""
    for layer, held in enumerate(shared_prefix(model, prefix_ids).layers):
        cache.update(held.keys.clone(), held.values.clone(), layer)
    return cache


def shared_prefix(model, prefix_ids: list[int]) -> DynamicCache:
    """The prefix prefilled at positions 0..P-1 into a config-less cache (RoPE applied), computed once per model
    and prefix and shared by every caller (`prefix_cache`, the repair, `DocumentPrefill`): they copy from it and
    never change it. A model loaded by `load_model` also keeps it on disk (`saved_prefix_path`), so a new process
    (each `cagkit ask`) reads it instead of prefilling it before its first token."""
    if not prefix_ids:
        return DynamicCache()
    memo = model.__dict__.setdefault("_cagkit_prefix_kv", {})
    key = tuple(prefix_ids)
    if key not in memo:
        path = saved_prefix_path(model, prefix_ids)
        built = _read_prefix(model, path, prefix_ids) if path is not None else None
        if built is None:
            built = DynamicCache()  # config-less: a prefix longer than a sliding window keeps every token
            ids = torch.tensor([prefix_ids], dtype=torch.long, device=model_device(model))
            decoder_stack(model)(input_ids=ids, cache=built, use_cache=True)
            if path is not None:
                _write_prefix(path, built, prefix_ids)
        if len(memo) >= 8:  # a few prompts' prefixes per model (one per chat template in practice)
            memo.pop(next(iter(memo)))
        memo[key] = built
    return memo[key]


def saved_prefix_path(model, prefix_ids: list[int]) -> Path | None:
    """Where the KV of `prefix_ids` prefilled by `model` is kept between processes:
    `$CAGKIT_HOME/prefix-kv/<key>.safetensors`, the key a digest of everything the KV depends on (the weights'
    fingerprint, dtype, device type, attention implementation, torch and transformers versions, the token ids), so
    a file read back is the cache this process would compute. None for a model without a fingerprint (one not
    loaded by `load_model`)."""
    fingerprint = model.__dict__.get("_cagkit_fingerprint")
    if not fingerprint:
        return None
    import transformers

    from cagkit.models.registry import cagkit_home

    parts = [fingerprint, str(next(model.parameters()).dtype), model_device(model).type,
             str(getattr(model.config, "_attn_implementation", None)), torch.__version__, transformers.__version__,
             [int(i) for i in prefix_ids]]
    key = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]
    return cagkit_home() / "prefix-kv" / f"{key}.safetensors"


def _read_prefix(model, path: Path, prefix_ids: list[int]) -> DynamicCache | None:
    """The prefix cache kept at `path`, or None where there is none that holds every layer of these token ids
    (missing, damaged, or written for others), so it is prefilled again."""
    from safetensors.torch import load_file

    try:
        tensors = load_file(path, device=str(model_device(model)))
    except Exception:  # noqa: BLE001 - missing or unreadable: prefilled again and written anew
        return None
    layers = len(decoder_stack(model).layers)
    ids = tensors.get("ids")
    if ids is None or ids.tolist() != [int(i) for i in prefix_ids]:
        return None
    cache = DynamicCache()
    for layer in range(layers):
        keys, values = tensors.get(f"{layer}.keys"), tensors.get(f"{layer}.values")
        if keys is None or values is None or keys.shape[-2] != len(prefix_ids) or values.shape[-2] != len(prefix_ids):
            return None
        cache.update(keys, values, layer)
    return cache


def _write_prefix(path: Path, cache: DynamicCache, prefix_ids: list[int]) -> None:
    """Keep `cache` at `path` for later processes; where it cannot be written (a read-only home), it is not."""
    from safetensors.torch import save_file

    from cagkit.files import atomic_write

    tensors = {"ids": torch.tensor(prefix_ids, dtype=torch.int64)}
    for layer, held in enumerate(cache.layers):
        tensors[f"{layer}.keys"] = held.keys.detach().contiguous().cpu()
        tensors[f"{layer}.values"] = held.values.detach().contiguous().cpu()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as tmp:
            save_file(tensors, tmp)
    except OSError:
        pass


def sink_ids(lm: LoadedModel) -> list[int]:
    """The short target-native prefix a chunk is prefilled or translated after (the attention sink): BOS when
    the model has one, else its end-of-text token."""
    tok = lm.tokenizer
    first = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
    return [first] if first is not None else []


def chunk_alone_kv(lm: LoadedModel, text: str, layers: int | None = None) -> ChunkKV:
    """The target's own RoPE-free KV of `text` prefilled alone after its sink (the sink's KV left out): what
    the translators are trained to reproduce. With `layers`, only the bottom `layers` layers."""
    sink = sink_ids(lm)
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    kv = prefill_kv(lm.model, sink + ids, layers=layers)
    return ChunkKV(kv.keys[:, len(sink):], kv.values[:, len(sink):])


# The document's first tokens kept as the attention sink once a document outgrows its window (StreamingLLM keeps 4).
SINK_TOKENS = 4


class DocumentPrefill:
    """Prefill one document part after part, as the model reads it, and give each part's RoPE-free KV.

    The prompt prefix `prefix_ids` (the chat header a question will be asked under) is prefilled first; then each
    part, given by `add` in document order, attends to the prefix and every document token before it, causally,
    up to `window` positions in all. Past the window the cache slides as StreamingLLM's does: the prefix and the
    document's first `sink_tokens` tokens stay as the attention sink, the oldest of the others are dropped, and
    the tokens kept sit at consecutive positions 0..K-1 (positions within the cache, not the text), the new part
    at K.. . So memory holds at most `window` tokens of KV whatever the document's length. Within the window the
    KV is the one a prefill of the prefix and the whole document in one pass gives, up to float rounding: for the
    model that wrote it, the document's chunks placed at consecutive positions after the same prefix are native
    prefill's cache.
    """

    def __init__(self, model, prefix_ids: list[int], window: int, tables: RotaryTables | None = None,
                 sink_tokens: int = SINK_TOKENS) -> None:
        if window < len(prefix_ids) + sink_tokens + 2:
            raise ValueError(f"a window of {window} tokens leaves no room after the prefix and sink")
        self.model = model
        self.tables = tables or RotaryTables(model)
        self.window = window
        self.prefix_tokens = len(prefix_ids)
        self.sink_tokens = sink_tokens
        self.read = 0  # document tokens read so far
        self.dropped = 0  # document tokens slid out of the window so far
        self._sink: ChunkKV | None = None  # the prefix, then the document's first tokens
        if prefix_ids:  # from the per-model memo: a run over many short documents prefills the prefix once
            keys, values = _rope_free(shared_prefix(model, prefix_ids), self.tables, len(prefix_ids),
                                      model_device(model))
            self._sink = ChunkKV(keys[0], values[0])
        self._recent: ChunkKV | None = None  # the document tokens after the sink still in the window

    @property
    def room(self) -> int:
        """The most tokens one part may have: half of what the window leaves after the sink."""
        return max(1, (self.window - self.prefix_tokens - self.sink_tokens) // 2)

    @torch.no_grad()
    def add(self, input_ids: list[int]) -> ChunkKV:
        """The RoPE-free KV [L, T, H, D] (fp32) of the next `input_ids` of the document."""
        if not input_ids:
            raise ValueError("a document part needs at least one token")
        if len(input_ids) > self.room:
            raise ValueError(f"a part of {len(input_ids)} tokens is over the {self.room} a window of {self.window} "
                             f"allows")
        device = model_device(self.model)
        self._slide(len(input_ids))
        kept = _cat(self._sink, self._recent)
        start = kept.num_tokens if kept is not None else 0
        cache = DynamicCache()  # config-less: every layer keeps what it is given; the model's mask does the windowing
        if kept is not None:
            dtype = next(self.model.parameters()).dtype
            positions = torch.arange(start, device=device)
            for layer in range(kept.keys.shape[0]):
                cos, sin = self.tables(layer, positions)
                k = apply_rope(kept.keys[layer].to(device), cos, sin)  # [K, H, D]
                cache.update(k.transpose(0, 1)[None].to(dtype), kept.values[layer].to(device).transpose(0, 1)[None]
                             .to(dtype), layer)
        ids = torch.tensor([input_ids], dtype=torch.long, device=device)
        positions = torch.arange(start, start + len(input_ids), device=device)
        decoder_stack(self.model)(input_ids=ids, position_ids=positions[None], cache=cache, use_cache=True)
        keys, values = _rope_free(cache, self.tables, start + len(input_ids), device, start)
        new = ChunkKV(keys[0], values[0])
        del cache
        self._keep(new)
        self.read += len(input_ids)
        return new

    def skip(self, kv: ChunkKV) -> None:
        """Take the next part of the document as already read: `kv`, its RoPE-free KV [L, T, H, D] as `add` gave it
        (read back from a store, where an interrupted ingest wrote it), enters the window as `add` would have put
        it there, sliding the same way, with no forward pass. The parts after it then attend to it as if it had
        been prefilled now (up to the store dtype's rounding, where it was stored below fp32)."""
        n = kv.num_tokens
        if n < 1:
            raise ValueError("a document part needs at least one token")
        if n > self.room:
            raise ValueError(f"a part of {n} tokens is over the {self.room} a window of {self.window} allows")
        held = self._sink if self._sink is not None else self._recent
        if held is not None and (kv.keys.shape[0], *kv.keys.shape[2:]) != (held.keys.shape[0], *held.keys.shape[2:]):
            raise ValueError(f"KV of shape {tuple(kv.keys.shape)} is not this model's: {held.keys.shape[0]} layers, "
                             f"{tuple(held.keys.shape[2:])} heads and head size")
        device = held.keys.device if held is not None else model_device(self.model)
        self._slide(n)
        self._keep(ChunkKV(kv.keys.to(device, torch.float32), kv.values.to(device, torch.float32)))
        self.read += n

    def _keep(self, new: ChunkKV) -> None:
        """Add `new` to the window: its first tokens to the sink while the sink lacks them, the rest to `_recent`."""
        sink_doc = min(self.read, self.sink_tokens)
        to_sink = min(self.sink_tokens - sink_doc, new.num_tokens)
        if to_sink:
            head = ChunkKV(new.keys[:, :to_sink], new.values[:, :to_sink])
            self._sink = _cat(self._sink, head)
        if new.num_tokens > to_sink:
            self._recent = _cat(self._recent, ChunkKV(new.keys[:, to_sink:], new.values[:, to_sink:]))

    def _slide(self, incoming: int) -> None:
        """Drop the oldest tokens after the sink until the window holds them and `incoming` more."""
        if self._recent is None:
            return
        held = (self._sink.num_tokens if self._sink is not None else 0) + self._recent.num_tokens
        over = held + incoming - self.window
        if over <= 0:
            return
        over = min(over, self._recent.num_tokens)
        self._recent = ChunkKV(self._recent.keys[:, over:].clone(), self._recent.values[:, over:].clone())
        self.dropped += over


def _cat(a: ChunkKV | None, b: ChunkKV | None) -> ChunkKV | None:
    """Two RoPE-free KVs one after the other along the tokens; either may be None."""
    if a is None or b is None:
        return a if b is None else b
    return ChunkKV(torch.cat([a.keys, b.keys.to(a.keys.device)], 1), torch.cat([a.values, b.values.to(a.values.device)], 1))
