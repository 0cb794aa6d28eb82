"""Router ablations of a Mixture-of-Translators: does the token-level router's choice carry anything?

Variants (every translated layer at once; the skip path and the trunk are untouched):
- `routed`: the checkpoint as trained.
- `shuffled`: each token gets the experts and gates the router chose for another token of the same chunk and
  layer (a fixed random permutation). Which experts are used, and how often, stays the same; what changes is
  which token gets which.
- `uniform`: every expert on every token, each weighted 1/E: the average expert.
- `skip`: no expert at all, only the low-rank linear path under them.
"""

from __future__ import annotations

import contextlib
import math

import torch

from cagkit.translate.translator import LayerTranslator

VARIANTS = ("routed", "shuffled", "uniform", "skip")


@contextlib.contextmanager
def routing(variant: str, seed: int = 0, usage: dict | None = None):
    """Replace `LayerTranslator.route` by the ablation `variant` for the duration; with `usage`, record per layer
    (by module id) the share of assignments per expert and the router's mean entropy / log E."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown routing variant {variant!r}; use any of {', '.join(VARIANTS)}")
    original = LayerTranslator.route
    generator = torch.Generator().manual_seed(seed)

    def route(self, h):
        probs, top_i, gates = original(self, h)  # probs [N, E], top_i and gates [N, k]
        if usage is not None:
            record = usage.setdefault(id(self), {"assignments": torch.zeros(probs.shape[1]), "entropy": 0.0, "rows": 0})
            record["assignments"] += torch.bincount(top_i.reshape(-1), minlength=probs.shape[1]).float()
            record["entropy"] += float(-(probs * probs.clamp_min(1e-12).log()).sum()) / math.log(probs.shape[1])
            record["rows"] += probs.shape[0]
        if variant == "shuffled":
            order = torch.randperm(h.shape[0], generator=generator).to(h.device)
            return probs, top_i[order], gates[order]
        if variant == "uniform":
            every = torch.arange(probs.shape[1], device=h.device).expand(h.shape[0], -1)  # [N, E]
            return probs, every, torch.full(every.shape, 1 / probs.shape[1], device=h.device)
        if variant == "skip":
            return probs, top_i, torch.zeros_like(gates)
        return probs, top_i, gates

    LayerTranslator.route = route
    try:
        yield
    finally:
        LayerTranslator.route = original
