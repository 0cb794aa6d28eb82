"""Cross-chunk repair of placed KV: recompute a share of the context's tokens with attention over every chunk.

Stored chunks were prefilled one at a time, so no token of a chunk ever attended to another chunk; translated
chunks add translation error on top. Placing them side by side therefore loses part of what a joint prefill of
the same text gives (cagkit's `oracle` method measures that loss). `blend` repairs it the way CacheBlend
(Yao et al., 2024) does, recomputing only a share of the tokens:

1. the target prefills its bottom two layers over the whole context jointly (2/L of a native prefill); those
   layers of every token are replaced by the joint, exact KV;
2. a `ratio` share of the context's tokens is selected: those whose layer-1 KV deviates most between the joint
   prefill and the placed cache (CacheBlend's choice), or those of a given `priority` order, such as
   `cagkit.kv.selection.question_priority` (whole sentences, the ones most similar to the question first);
3. the target recomputes the selected tokens through every layer in one forward pass, attending to the placed
   KV of the others and to each other's new KV (their stale entries left out), and their KV is replaced at
   every layer.

Everything stays RoPE-free `[L, T, H, D]` (`ChunkKV`), so the repaired chunks are placed as usual afterwards.

The recomputed tokens attend through `cagkit.kv.attention`: each run of consecutive positions (a whole sentence,
when the question chooses) attends to every key up to its own end, causally, over the layer's sliding window
where it has one: flash-attn on CUDA where it is installed, PyTorch's SDPA otherwise (`attention="runs"`). The
single forward with one dense mask over all of them (`attention="mask"`) computes the same and stays as the
reference and for models whose attention the runs do not cover (eager attention, logit soft-capping).
Cost: the projections and MLPs scale with `ratio`, but every recomputed token attends over the context before
it, so where attention dominates (long contexts on a CPU) ratio 0.5 takes about as long as a native prefill.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from cagkit.kv.attention import ROUTABLE, RUNS_KEYWORD, QueryRuns, route_query_runs
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.prefill import copy_prefix, prefill_kv
from cagkit.kv.rope import RotaryTables, apply_rope, remove_rope
from cagkit.kv.selection import top_tokens
from cagkit.models.architecture import decoder_stack, layer_types
from cagkit.models.device import model_device

JOINT_LAYERS = 2  # bottom layers prefilled jointly; the deviation is measured at the top one of them
ATTENTION = ("auto", "runs", "mask")


@torch.no_grad()
def blend(model, prefix_ids: list[int], chunks: list[ChunkKV], chunk_ids: list[list[int]], ratio: float,
          tables: RotaryTables | None = None, priority: torch.Tensor | None = None,
          attention: str = "auto") -> list[ChunkKV]:
    """`chunks` (placed in this order after `prefix_ids`) with a `ratio` share of their tokens recomputed over the
    whole context, and their bottom layers prefilled jointly. `chunk_ids`: each chunk's token ids in `model`'s
    vocabulary, one per KV position. ratio 0 returns `chunks` unchanged; ratio 1 equals a joint prefill.
    `priority` ([total tokens], higher first) replaces the layer-1 deviation as the selection order, e.g.
    `cagkit.kv.selection.question_priority`; either way `cagkit.kv.selection.budget` says how many are taken.
    `attention`: how the recomputed tokens attend: `runs` (each run of consecutive positions through
    `cagkit.kv.attention`), `mask` (one dense mask, for eager or SDPA attention) or `auto` (runs where the
    model's attention allows them, else the mask)."""
    if attention not in ATTENTION:
        raise ValueError(f"unknown repair attention {attention!r}; use {', '.join(ATTENTION)}")
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"the blend ratio must be between 0 and 1, got {ratio}")
    if ratio == 0.0 or not chunks:
        return chunks
    for kv, ids in zip(chunks, chunk_ids, strict=True):
        if kv.num_tokens != len(ids):
            raise ValueError(f"a chunk has {kv.num_tokens} KV positions but {len(ids)} token ids")
    tables = tables or RotaryTables(model)
    device = model_device(model)
    sizes = [kv.num_tokens for kv in chunks]
    keys = torch.cat([kv.keys.to(device).float() for kv in chunks], dim=1)  # [L, M, H, D]
    values = torch.cat([kv.values.to(device).float() for kv in chunks], dim=1)
    num_layers, total = keys.shape[0], keys.shape[1]
    start = len(prefix_ids)
    ids = list(prefix_ids) + [t for c in chunk_ids for t in c]

    joint_layers = min(JOINT_LAYERS, num_layers)
    joint = prefill_kv(model, ids, tables, layers=joint_layers)
    joint_k, joint_v = joint.keys[:, start:], joint.values[:, start:]
    top = joint_layers - 1
    deviation = _relative_error(keys[top], joint_k[top]) + _relative_error(values[top], joint_v[top])
    keys[:joint_layers], values[:joint_layers] = joint_k, joint_v

    if priority is not None and priority.shape != (total,):
        raise ValueError(f"priority has shape {tuple(priority.shape)}, expected ({total},): one per context token")
    order = deviation if priority is None else priority.to(device)  # own precision: ties are broken by tiny steps
    chosen = top_tokens(order, ratio)  # chunk-relative indices
    if joint_layers < num_layers:
        new_k, new_v = _recompute(model, ids, start, ChunkKV(keys, values), chosen, tables, attention)
        keys[joint_layers:, chosen] = new_k[joint_layers:]
        values[joint_layers:, chosen] = new_v[joint_layers:]
    return [ChunkKV(k, v) for k, v in zip(keys.split(sizes, dim=1), values.split(sizes, dim=1))]


def _relative_error(approx: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Per token, squared error of [T, H, D] `approx` over the mean squared norm of `exact` -> [T]."""
    return ((approx - exact) ** 2).sum((-1, -2)) / (exact**2).sum((-1, -2)).mean().clamp_min(1e-12)


def runs_implementation(model) -> str | None:
    """The attention implementation of `model` that the repair's query runs go through (`route_query_runs`), or
    None where they cannot: eager attention, or logit soft-capping, which `cagkit.kv.attention` does not do."""
    config = decoder_stack(model).config
    implementation = config._attn_implementation
    if implementation not in ROUTABLE or getattr(config, "attn_logit_softcapping", None) is not None:
        return None
    return implementation


def _recompute(model, ids: list[int], start: int, placed: ChunkKV, chosen: torch.Tensor,
               tables: RotaryTables, attention: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE-free KV [L, S, H, D] of the `chosen` context tokens (indices after the prefix) recomputed through
    every layer over the prefix and the `placed` chunks."""
    decoder = decoder_stack(model)
    implementation = runs_implementation(model) if attention != "mask" else None
    if attention == "runs" and implementation is None:
        raise ValueError(f"the repair cannot attend in runs through {decoder.config._attn_implementation!r} "
                         "attention or with logit soft-capping; use attention='mask'")
    if attention == "mask" and decoder.config._attn_implementation not in ("eager", "sdpa"):
        raise ValueError(f"a dense mask needs eager or sdpa attention, not {decoder.config._attn_implementation!r}")
    dtype = next(model.parameters()).dtype
    device = model_device(model)
    # config-less: every layer keeps every token (the runs or masks below do the windowing); the prompt's prefix
    # from the per-model memo
    cache = copy_prefix(DynamicCache(), model, ids[:start])
    # The cache holds the prefix and the tokens that are not recomputed, each at its own position; the chosen
    # tokens' stale entries are left out, so attention spans the context once.
    kept = torch.ones(placed.num_tokens, dtype=torch.bool, device=device)
    kept[chosen] = False
    kept_positions = kept.nonzero().flatten() + start
    for layer in range(placed.keys.shape[0]):
        cos, sin = tables(layer, kept_positions)
        k = apply_rope(placed.keys[layer, kept].float(), cos, sin)  # [K, H, D]
        cache.update(k.transpose(0, 1)[None].to(dtype), placed.values[layer, kept].transpose(0, 1)[None].to(dtype),
                     layer)
    positions = chosen + start
    # Each chosen token sees the kept tokens before it and the chosen tokens' new KV (appended last) up to itself.
    key_pos = torch.cat([torch.arange(start, device=device), kept_positions, positions])
    query = torch.tensor([[ids[p] for p in positions.tolist()]], device=device)
    context = cache.get_seq_length()
    if implementation is not None:
        # The cache's entries are every position 0..start+M-1 once, so in position order the keys a run of
        # consecutive chosen positions sees are one prefix: attention per run, causal from its own end.
        route_query_runs(implementation)
        plan = QueryRuns.of(key_pos, positions)
        placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)  # taken as given, read by nobody
        decoder(input_ids=query, position_ids=positions[None], attention_mask=placeholder, cache=cache,
                use_cache=True, **{RUNS_KEYWORD: plan})
    else:
        decoder(input_ids=query, position_ids=positions[None], attention_mask=_dense_mask(model, positions, key_pos),
                cache=cache, use_cache=True)
    keys, values = [], []
    for layer, cached in enumerate(cache.layers):
        k = cached.keys[0, :, context:].transpose(0, 1).float()  # [H, S, D] -> [S, H, D]
        cos, sin = tables(layer, positions)
        keys.append(remove_rope(k, cos, sin))
        values.append(cached.values[0, :, context:].transpose(0, 1).float())
    return torch.stack(keys), torch.stack(values)


def _dense_mask(model, positions: torch.Tensor, key_pos: torch.Tensor):
    """The additive mask of the chosen tokens at `positions` over the cache's entries at `key_pos`: causal by
    absolute position, and a second one over the sliding window where the model has sliding layers."""
    dtype = next(model.parameters()).dtype
    allowed = key_pos[None, :] <= positions[:, None]
    config = model.config.get_text_config()
    masks = {"full_attention": _additive(allowed, dtype)}
    if "sliding_attention" in layer_types(config):
        near = positions[:, None] - key_pos[None, :] < config.sliding_window
        masks["sliding_attention"] = _additive(allowed & near, dtype)
    return masks if len(masks) > 1 else masks["full_attention"]


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A [1, 1, Q, K] additive mask (0 where allowed), which eager and SDPA attention both read."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]
