"""Place RoPE-free chunk KV into a target's transformers cache, each chunk at the positions after the ones
before it: keys `[L, T, H, D]` become `[B, H, T, D]` per layer with the target's RoPE re-applied.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

from cagkit.kv.chunk import ChunkKV
from cagkit.kv.rope import RotaryTables
from cagkit.models.device import model_device


@torch.no_grad()
def place_chunks(model, cache: DynamicCache, chunks: list[ChunkKV], tables: RotaryTables | None = None) -> None:
    """Append chunks after what `cache` holds, re-applying RoPE at their new positions.

    Sliding-window layers keep only their last window of tokens, exactly as after a native prefill.

    Each layer's keys and values are written once into the tensors the cache keeps: the chunks are copied into
    place without being joined first, RoPE writes its halves in place, and a full-attention layer that already
    holds the prompt prefix gets one tensor of prefix and chunks instead of a concatenation. The rotation is the
    one `cagkit.kv.rope.apply_rope` computes, operation for operation, so the keys are the same to the bit. A
    sliding-window layer is given only the last tokens it keeps (its window less one), and counts the rest as seen.
    """
    if not chunks:
        return
    tables = tables or RotaryTables(model)
    start = cache.get_seq_length()
    device = model_device(model)
    dtype = next(model.parameters()).dtype
    if any(c.keys.device != device for c in chunks):  # one transfer a chunk, not one a chunk and layer
        chunks = [ChunkKV(c.keys.to(device), c.values.to(device)) for c in chunks]
    layers, _, heads, dim = chunks[0].keys.shape
    n = sum(c.num_tokens for c in chunks)
    half = dim // 2
    positions = torch.arange(start, start + n, device=device)
    raw = torch.empty(n, heads, dim, dtype=torch.float32, device=device)  # one layer's RoPE-free keys, reused
    product = torch.empty(n, heads, half, dtype=torch.float32, device=device)
    rotated = None if dtype == torch.float32 else torch.empty(n, heads, dim, dtype=torch.float32, device=device)
    angles: dict = {}  # cos and sin halves per rotary kind: most models have one for every layer, Gemma 3 two
    for layer in range(layers):
        kind = tables.kind(layer)
        if kind not in angles:
            cos, sin = tables(layer, positions)  # [n, D]
            angles[kind] = [t[:, None, :].contiguous() for t in (cos[:, :half], cos[:, half:], sin[:, :half],
                                                                  sin[:, half:])]
        cos1, cos2, sin1, sin2 = angles[kind]
        held = cache.layers[layer] if layer < len(cache.layers) else None
        # a full-attention layer holding the prefix takes one tensor of both; any other goes through `update`
        joined = type(held) is DynamicLayer and held.is_initialized and held.keys.numel() > 0
        # a sliding-window layer keeps its last `sliding_window - 1` tokens: those are all it needs to be given
        skip = 0
        if (isinstance(held, DynamicSlidingWindowLayer) and not held.record_past
                and hasattr(held, "cumulative_length") and 0 < held.sliding_window - 1 < n):
            skip = n - (held.sliding_window - 1)
        kept = n - skip
        before = held.keys.shape[-2] if joined else 0
        keys = torch.empty(1, heads, before + kept, dim, dtype=dtype, device=device)
        values = torch.empty(1, heads, before + kept, dim, dtype=dtype, device=device)
        if joined:
            keys[:, :, :before].copy_(held.keys)
            values[:, :, :before].copy_(held.values)
        at = 0  # where each chunk starts among the placed tokens
        for c in chunks:
            first = max(skip - at, 0)  # the chunk's first token that is kept
            if first < c.num_tokens:
                to = at + first - skip
                count = c.num_tokens - first
                raw[to:to + count].copy_(c.keys[layer, first:])
                values[0, :, before + to:before + to + count].copy_(c.values[layer, first:].transpose(0, 1))
            at += c.num_tokens
        # keys * cos + rotate_half(keys) * sin, one half at a time: [k1 c1 - k2 s1, k2 c2 + k1 s2]
        out = keys[0, :, before:].transpose(0, 1) if rotated is None else rotated[:kept]  # [kept, H, D]
        k1, k2 = raw[:kept, :, :half], raw[:kept, :, half:]
        part = product[:kept]
        torch.mul(k1, cos1[skip:], out=out[..., :half]).sub_(torch.mul(k2, sin1[skip:], out=part))
        torch.mul(k2, cos2[skip:], out=out[..., half:]).add_(torch.mul(k1, sin2[skip:], out=part))
        if rotated is not None:
            keys[0, :, before:].copy_(rotated[:kept].transpose(0, 1))
        if joined:
            held.keys, held.values = keys, values
        else:
            cache.update(keys, values, layer)
            if skip:
                held.cumulative_length += skip  # the tokens it was not given were placed all the same
