"""The training objective of a translator, on one batch of paired-prefill examples (`batch_losses`).

KV reconstruction (MSE of the normalised K and V per translated layer) + Context Correction Loss: the frozen
target replays the continuation over `sink + translated prefix` and is pulled towards its native replay (KL over
the native top logits, renormalised, or with `full_vocab_kl` over the whole vocabulary as those tokens plus one bin
for the rest; plus the relative MSE of every layer's hidden states), with gradients only into the translator + a
load-balancing term that keeps every expert in use.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache

from cagkit.config import TrainSettings
from cagkit.kv.prefill import sink_ids
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


def batch_losses(net: TranslatorNet, target: LoadedModel, batch: dict, settings: TrainSettings,
                 tables: RotaryTables) -> dict[str, torch.Tensor]:
    """The weighted training loss of one batch of examples and its parts (kv, kl, hidden, balance)."""
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
    return {"loss": loss, "kv": kv_loss, "kl": kl, "hidden": hidden, "balance": balance}
