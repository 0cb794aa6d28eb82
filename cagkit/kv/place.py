"""Place RoPE-free chunk KV into a target's transformers cache, each chunk at the positions after the ones
before it: keys `[L, T, H, D]` become `[B, H, T, D]` per layer with the target's RoPE re-applied.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from cagkit.kv.chunk import ChunkKV
from cagkit.kv.rope import RotaryTables, apply_rope
from cagkit.models.device import model_device


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
    angles: dict = {}  # cos, sin per rotary kind: most models have one for every layer, Gemma 3 two
    for layer in range(keys.shape[0]):
        kind = tables.kind(layer)
        if kind not in angles:
            angles[kind] = tables(layer, positions)
        cos, sin = angles[kind]
        k = apply_rope(keys[layer].float(), cos, sin)  # [N, H, D]
        # [N, H, D] -> [1, H, N, D]
        cache.update(k.transpose(0, 1)[None].to(dtype), values[layer].transpose(0, 1)[None].to(dtype), layer)
