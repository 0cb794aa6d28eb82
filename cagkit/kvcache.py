"""Prefill a model to capture per-layer KV, and place stored (RoPE-free) KV into a model's cache.

Layouts: cagkit keeps KV in the flash-attention layout, per layer `[T, H, D]`, stacked over layers as
`[L, T, H, D]`. transformers' cache holds `[B, H, T, D]` per layer; the conversions live here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from cagkit.rope import RotaryTables, apply_rope, decoder_stack, remove_rope


@dataclass
class ChunkKV:
    """The RoPE-free KV of one chunk. keys, values: [L, T, H, D]."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[1]


def model_device(model) -> torch.device:
    """The device of a model's weights: where its inputs (and the KV placed into its cache) must be (the CPU for
    a model without parameters)."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work, so a wall-clock reading after it counts that work (no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def _rope_free(cache: DynamicCache, tables: RotaryTables, length: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Every cached layer's keys with RoPE removed (positions 0..length-1) and its values, in fp32:
    [B, L, T, H, D] each."""
    positions = torch.arange(length, device=device)
    keys, values = [], []
    for layer, cached in enumerate(cache.layers):
        cos, sin = tables(layer, positions)
        k = cached.keys.transpose(1, 2).float()  # [B, H, T, D] -> [B, T, H, D]
        keys.append(remove_rope(k, cos, sin))  # cos, sin [T, D] broadcast over the batch
        values.append(cached.values.transpose(1, 2).float())
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
    """Prefill the target-native prefix (chat header, BOS) into a cache shaped by the model's config."""
    cache = DynamicCache(config=model.config)
    if prefix_ids:
        model(input_ids=torch.tensor([prefix_ids], dtype=torch.long, device=model_device(model)), cache=cache,
              use_cache=True)
    return cache


@torch.no_grad()
def place_chunks(model, cache: DynamicCache, chunks: list[ChunkKV], tables: RotaryTables | None = None) -> None:
    """Append chunks after what `cache` holds, re-applying RoPE at their new positions.

    Sliding-window layers keep only their last window of tokens, exactly as after a native prefill.
    """
    if not chunks:
        return
    tables = tables or RotaryTables(model)
    start = cache.get_seq_length()
    device = model_device(model)
    keys = torch.cat([c.keys.to(device) for c in chunks], dim=1)  # [L, N, H, D]
    values = torch.cat([c.values.to(device) for c in chunks], dim=1)
    positions = torch.arange(start, start + keys.shape[1], device=device)
    dtype = next(model.parameters()).dtype
    for layer in range(keys.shape[0]):
        cos, sin = tables(layer, positions)
        k = apply_rope(keys[layer].float(), cos, sin)  # [N, H, D]
        # [N, H, D] -> [1, H, N, D]
        cache.update(k.transpose(0, 1)[None].to(dtype), values[layer].transpose(0, 1)[None].to(dtype), layer)
