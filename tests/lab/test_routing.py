"""The router ablations of `lab.routing` (run by benchmarks/routing.py) on one small random MoT layer: each variant
computes what it says, keeps the skip path, and the layer's own routing is back afterwards. No real models."""

from __future__ import annotations

import pytest
import torch

from cagkit.translate.translator import LayerTranslator, TranslatorConfig
from lab import routing


def _layer_and_input():
    torch.manual_seed(0)
    cfg = TranslatorConfig(kind="mot", source_layers=4, source_kv_dim=8, target_layers=3, target_heads=1,
                           target_head_dim=4, target_embed_dim=8, num_experts=4, top_k=2, width=16,
                           expert_hidden=8, token_dim=8, skip_rank=6)
    layer = LayerTranslator(cfg, source_dim=12, in_dim=20)
    for expert in layer.experts:  # wake the experts, which start silent
        torch.nn.init.normal_(expert[-1].weight)
    x = torch.randn(40, 20)
    h = layer.trunk(torch.cat([layer.skip[0](x[:, :12]), x[:, 12:]], dim=-1))
    return layer, x, h


@torch.no_grad()
def test_each_variant_computes_what_it_says_and_the_routing_is_restored():
    layer, x, h = _layer_and_input()
    routed, _ = layer(x)
    skip = layer.skip(x[:, :12])
    experts = torch.stack([e(h) for e in layer.experts])  # [E, N, out]

    usage: dict = {}
    with routing.routing("routed", usage=usage):
        assert torch.allclose(layer(x)[0], routed)
    record = usage[id(layer)]
    assert record["rows"] == 40 and record["assignments"].sum() == 80  # two experts per row
    assert 0 < record["entropy"] / record["rows"] <= 1

    with routing.routing("skip"):
        assert torch.allclose(layer(x)[0], skip, atol=1e-6)
    with routing.routing("uniform"):
        assert torch.allclose(layer(x)[0], skip + experts.mean(0), atol=1e-5)
    with routing.routing("shuffled", seed=3):
        shuffled, _ = layer(x)
    _, top_i, gates = layer.route(h)
    order = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    expected = skip.clone()
    for n in range(40):  # row n gets the experts and gates chosen for row order[n], applied to its own h
        for g, e in zip(gates[order[n]], top_i[order[n]]):
            expected[n] += g * experts[int(e), n]
    assert torch.allclose(shuffled, expected, atol=1e-5) and not torch.allclose(shuffled, routed, atol=1e-3)

    assert torch.allclose(layer(x)[0], routed)  # the layer routes as trained again


def test_an_unknown_variant_is_refused_and_the_routing_left_alone():
    original = LayerTranslator.route
    with pytest.raises(ValueError, match="unknown routing variant 'random'; use any of routed, shuffled"):
        with routing.routing("random"):
            pass
    assert LayerTranslator.route is original
