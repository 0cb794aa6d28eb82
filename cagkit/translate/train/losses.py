"""The training objective of a translator, on one batch of paired-prefill examples (`batch_losses`).

KV reconstruction (MSE of the normalised K and V per translated layer) + Context Correction Loss: the frozen
target replays the continuation over `sink + translated prefix` and is pulled towards its native replay (KL over
the native top logits, renormalised, or with `full_vocab_kl` over the whole vocabulary as those tokens plus one bin
for the rest; plus the relative MSE of every layer's hidden states), with gradients only into the translator + a
load-balancing term that keeps every expert in use; optionally the KL of the continuation's attention over the
prefix (`attention_weight`).
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache

from cagkit.config import TrainSettings
from cagkit.kv.prefill import prefill_kv, sink_ids
from cagkit.kv.rope import RotaryTables, apply_rope
from cagkit.models.loading import LoadedModel
from cagkit.translate.train.data import target_logits
from cagkit.translate.translator import TranslatorConfig, TranslatorNet, embedding_layer_kv, token_features


def place_differentiable(target: LoadedModel, cache: DynamicCache, kv: torch.Tensor, cfg: TranslatorConfig,
                         tables: RotaryTables) -> None:
    """Append RoPE-free K|V [B, P, Lt, 2Ft] after `cache`'s contents with the target's RoPE, keeping gradients
    (the differentiable twin of `cagkit.kv.place.place_chunks`)."""
    batch, steps = kv.shape[:2]
    start = cache.get_seq_length()
    positions = torch.arange(start, start + steps)
    for layer in range(cfg.target_layers):
        k = kv[:, :, layer, : cfg.target_kv_dim].reshape(batch, steps, cfg.target_heads, cfg.target_head_dim)
        v = kv[:, :, layer, cfg.target_kv_dim:].reshape(batch, steps, cfg.target_heads, cfg.target_head_dim)
        cos, sin = tables(layer, positions)
        k = apply_rope(k, cos, sin)  # [B, P, H, D]
        cache.update(k.transpose(1, 2), v.transpose(1, 2), layer)  # [B, H, P, D]


def full_target_kv(net: TranslatorNet, target: LoadedModel, pred: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Translated K|V [B, P, Lx, 2Ft] (normalised) plus the exact embedding layers -> raw K|V [B, P, Lt, 2Ft]."""
    raw = net.denormalise(pred)
    if not net.cfg.native_layers:
        return raw
    bottom = []
    for row in ids:
        k, v = embedding_layer_kv(target.model, row)  # [P, H, D]
        bottom.append(torch.cat([k.flatten(1), v.flatten(1)], dim=-1))
    return torch.cat([torch.stack(bottom)[:, :, None], raw], dim=2)


def context_correction(target: LoadedModel, kv: torch.Tensor, batch: dict, cfg: TranslatorConfig,
                       tables: RotaryTables) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL, hidden) of the frozen target replaying the continuation over `sink + translated prefix` vs native.
    The KL is over the whole vocabulary (`top_bins_kl`) when the batch carries the native log-partition, else
    over the native top logits, renormalised."""
    sink = sink_ids(target)
    b = kv.shape[0]
    cache = DynamicCache(config=target.model.config)
    if sink:
        with torch.no_grad():
            target.model.get_decoder()(input_ids=torch.tensor([sink] * b), cache=cache, use_cache=True)
    place_differentiable(target, cache, kv, cfg, tables)
    out = target.model.get_decoder()(
        input_ids=batch["continuation"], cache=cache, use_cache=True, output_hidden_states=True
    )
    hidden = torch.stack(out.hidden_states[1:], dim=1)  # [B, Lt, C, E]
    native = batch["hidden"].float()
    mask = batch["mask"].float() if "mask" in batch else torch.ones(batch["continuation"].shape)  # [B, C]
    weight = mask[:, None, :, None]  # 0 on a question-answer continuation's padding
    # per-channel relative error: a few huge residual channels must not drown the rest
    scale = (native.pow(2) * weight).sum(dim=(0, 2), keepdim=True) / weight.sum(dim=(0, 2), keepdim=True)
    scale = scale + 1e-3 * scale.mean(dim=-1, keepdim=True)  # [1, Lt, 1, E]
    positions = weight.sum() * hidden.shape[1] * hidden.shape[-1]  # real positions x layers x channels
    hidden_loss = ((hidden - native).pow(2) / scale * weight).sum() / positions
    if "logsumexp" in batch:
        kl = top_bins_kl(batch["top_logits"].float(), batch["logsumexp"].float(), batch["top_ids"],
                         target_logits(target, out.last_hidden_state), mask)
        return kl, hidden_loss
    rows = target.model.get_output_embeddings().weight[batch["top_ids"]]  # [B, C, K, E]
    logits = torch.einsum("bce,bcke->bck", out.last_hidden_state, rows)
    cap = getattr(target.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    native_logp = torch.log_softmax(batch["top_logits"].float(), dim=-1)
    kl = (native_logp.exp() * (native_logp - torch.log_softmax(logits, dim=-1))).sum(-1)  # [B, C]
    return (kl * mask).sum() / mask.sum(), hidden_loss


def top_bins_kl(native_top: torch.Tensor, native_lse: torch.Tensor, top_ids: torch.Tensor,
                logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Mean over positions (those where `mask` [...] is 1, if given) of KL(native || translated) over K + 1
    bins: the native top-K tokens and one bin for the rest of the vocabulary. `native_top` [..., K] are the
    native logits of `top_ids`, `native_lse` [...] their full log-partition, `logits` [..., V] the translated
    full logits."""
    native_logp = native_top - native_lse.unsqueeze(-1)  # [..., K], exact log-probabilities
    native_rest = torch.log1p(-native_logp.exp().sum(-1).clamp(max=1 - 1e-6))  # log of the mass outside top-K
    lse = logits.logsumexp(-1, keepdim=True)
    logp = logits.gather(-1, top_ids) - lse
    rest = logits.scatter(-1, top_ids, float("-inf")).logsumexp(-1) - lse.squeeze(-1)
    kl = (native_logp.exp() * (native_logp - logp)).sum(-1) + native_rest.exp() * (native_rest - rest)
    return kl.mean() if mask is None else (kl * mask).sum() / mask.sum()


def attention_loss(target: LoadedModel, kv: torch.Tensor, batch: dict, cfg: TranslatorConfig,
                   tables: RotaryTables) -> torch.Tensor:
    """Mean over the translated layers (above layer 0) of KL(native || translated) of the attention that the
    continuation's native queries give the sink and the prefix, with the native prefix keys vs the translated
    keys `kv` (raw RoPE-free K|V [B, P, Lt, 2Ft]). The sink is the same on both sides, so the loss sees how much
    attention goes to the context at all, not only where in it."""
    layers = [layer for layer in cfg.translated_layers if layer > 0]  # layer 0's input is not kept in `hidden`
    sink = sink_ids(target)
    with torch.no_grad():
        sink_keys = prefill_kv(target.model, sink, tables).keys.to(kv.dtype) if sink else None  # [Lt, S, Hk, D]
    total = kv.new_zeros(())
    mask = batch["mask"].to(kv.dtype)[:, None, None, :] if "mask" in batch else None  # [B, 1, 1, C]
    for layer in layers:
        native, translated = prefix_attention(target, [batch["target_kv"].to(kv.dtype), kv], batch["hidden"], layer,
                                              cfg, tables, sink_keys)
        kl = (native.exp() * (native - translated)).sum(-1)  # [B, Hk, G, C]
        total = total + (kl.mean() if mask is None else (kl * mask).sum() / (mask.sum() * kl.shape[1] * kl.shape[2]))
    return total / max(len(layers), 1)


def prefix_attention(target: LoadedModel, kvs: list[torch.Tensor], hidden: torch.Tensor, layer: int,
                     cfg: TranslatorConfig, tables: RotaryTables,
                     sink_keys: torch.Tensor | None = None) -> list[torch.Tensor]:
    """Per K|V in `kvs` (raw RoPE-free [B, P, Lt, 2Ft]), the log-attention [B, Hk, G, C, S + P] of the
    continuation's queries in `layer` over the sink keys (RoPE-free [Lt, S, Hk, D], if given) and its prefix
    keys, normalised over those positions. The queries, computed once, come from `hidden` [B, Lt, C, E], each
    layer's output over the continuation (the next layer's input), at the positions the training replay uses:
    sink, prefix, continuation. Gradients flow into the keys only."""
    attn = target.model.get_decoder().layers[layer].self_attn
    b, steps = kvs[0].shape[:2]
    length = hidden.shape[2]
    start = len(sink_ids(target))
    heads, dim = cfg.target_heads, cfg.target_head_dim
    dtype = kvs[0].dtype
    with torch.no_grad():
        x = target.model.get_decoder().layers[layer].input_layernorm(hidden[:, layer - 1].to(dtype))  # [B, C, E]
        q = attn.q_proj(x).view(b, length, -1, dim)  # [B, C, Hq, D]
        if getattr(attn, "q_norm", None) is not None:
            q = attn.q_norm(q)
        q = apply_rope(q, *tables(layer, torch.arange(start + steps, start + steps + length)))
        q = q.view(b, length, heads, -1, dim) * attn.scaling  # [B, C, Hk, G, D]: query heads grouped by KV head
    first = start - (sink_keys.shape[1] if sink_keys is not None else 0)  # the position of the first key
    cos, sin = tables(layer, torch.arange(first, start + steps))
    cap = getattr(attn, "attn_logit_softcapping", None) or getattr(attn.config, "attn_logit_softcapping", None)
    window = getattr(attn, "sliding_window", None)
    # a sliding-window layer: a query sees the keys less than `window` positions back
    hidden_keys = (torch.arange(start + steps, start + steps + length)[:, None] - torch.arange(first, start + steps)
                   >= window) if window else None  # [C, S + P]
    out = []
    for kv in kvs:
        k = kv[:, :, layer, : cfg.target_kv_dim].reshape(b, steps, heads, dim)
        if sink_keys is not None:
            k = torch.cat([sink_keys[layer][None].expand(b, -1, -1, -1), k], dim=1)  # [B, S + P, Hk, D]
        logits = torch.einsum("bchgd,bphd->bhgcp", q, apply_rope(k, cos, sin))
        if cap:  # Gemma 2 style soft-capping
            logits = torch.tanh(logits / cap) * cap
        if hidden_keys is not None:
            logits = logits.masked_fill(hidden_keys, -1e9)  # a row with nothing in sight stays finite
        out.append(torch.log_softmax(logits, dim=-1))
    return out


def batch_losses(net: TranslatorNet, target: LoadedModel, batch: dict, settings: TrainSettings,
                 tables: RotaryTables) -> dict[str, torch.Tensor]:
    """The weighted training loss of one batch of examples and its parts (kv, kl, hidden, balance, and
    attention when it is weighted)."""
    cfg = net.cfg
    pred, balance = net(batch["source"].float(), token_features(target.model, batch["ids"]))
    kv_loss = (pred - net.normalise_target(batch["target_kv"][:, :, cfg.native_layers:].float())).pow(2).mean()
    full = full_target_kv(net, target, pred, batch["ids"])
    # Without the Context Correction Loss its parts are still measured (the log shows what the KV loss alone
    # does to them), but no graph is kept for a backward pass through the target.
    with contextlib.nullcontext() if settings.kl_weight or settings.hidden_weight else torch.no_grad():
        kl, hidden = context_correction(target, full, batch, cfg, tables)
    loss = (settings.kv_weight * kv_loss + settings.kl_weight * kl + settings.hidden_weight * hidden
            + settings.balance_weight * balance)
    parts = {"kv": kv_loss, "kl": kl, "hidden": hidden, "balance": balance}
    if settings.attention_weight:
        parts["attention"] = attention_loss(target, full, batch, cfg, tables)
        loss = loss + settings.attention_weight * parts["attention"]
    return {"loss": loss, **parts}
