"""Prefill a model and capture its per-layer KV with RoPE removed (`ChunkKV`), alone, in a batch, or after
the target's attention sink; and prefill a target-native prefix into a cache shaped by the model's config.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from cagkit.kv.chunk import ChunkKV
from cagkit.kv.rope import RotaryTables, remove_rope
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
