"""Gates on translated positions: a bias per layer and query head on the attention logits of translated keys
(`cagkit.kv.attention.KeyBias`), applied by the model's own attention function to a forward that carries one.
At zero it attends as the model does; closed, the translated keys are as if absent; it gets gradients."""

from __future__ import annotations

import pytest
import torch
from test_repair_runs import VOCAB, _tiny
from transformers import DynamicCache

from cagkit.kv.attention import KEY_BIAS_KEYWORD, KeyBias, biased_attention, reference_attention, route_attention
from cagkit.translate.translator import TranslatorConfig, TranslatorNet

MODELS = ["llama", "qwen2", "gemma3"]
TOKENS, TRANSLATED = 40, range(1, 30)  # 40 tokens, positions 1..29 translated (0 is the sink)


def _ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(3, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(seed))


def _bias(model, value: float, layers=None) -> KeyBias:
    """`value` on every query head of `layers` (default all) over the TRANSLATED positions."""
    config = model.config
    bias = torch.zeros(config.num_hidden_layers, config.num_attention_heads)
    bias[layers if layers is not None else slice(None)] = value
    translated = torch.zeros(TRANSLATED.stop, dtype=torch.bool)
    translated[TRANSLATED.start:] = True
    return KeyBias(bias, translated)


@pytest.mark.parametrize("window", [None, 5])
def test_biased_attention_at_zero_is_the_reference(window):
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 6, 4, 8, generator=g), torch.randn(1, 20, 2, 8, generator=g), torch.randn(1, 20, 2, 8, generator=g)
    torch.testing.assert_close(biased_attention(q, k, v, torch.zeros(4, 20), window),
                               reference_attention(q, k, v, True, window), atol=1e-5, rtol=1e-5)
    # a bias of b on one key multiplies its weight by e^b before renormalising: here, on one head only
    bias = torch.zeros(4, 20)
    bias[1, 17] = 1.5
    moved = biased_attention(q, k, v, bias, window)
    torch.testing.assert_close(moved[:, :, [0, 2, 3]], reference_attention(q, k, v, True, window)[:, :, [0, 2, 3]],
                               atol=1e-5, rtol=1e-5)
    assert not torch.allclose(moved[:, -3:, 1], reference_attention(q, k, v, True, window)[:, -3:, 1])


@pytest.mark.parametrize("kind", MODELS)
def test_open_gates_attend_as_the_model_does(kind):
    """Bias 0 everywhere: the same logits as the model's own attention, in one forward and after a cache (the
    tiny Gemma's 16-token sliding window is crossed)."""
    model = _tiny(kind)
    route_attention("sdpa")
    ids = _ids()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        gated = model(input_ids=ids, **{KEY_BIAS_KEYWORD: _bias(model, 0.0)}).logits
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :30], cache=cache, use_cache=True)
        after = model(input_ids=ids[:, 30:], cache=cache, use_cache=True, **{KEY_BIAS_KEYWORD: _bias(model, 0.0)})
    torch.testing.assert_close(gated, plain, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after.logits, plain[:, 30:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_closed_gates_hide_the_translated_keys(kind):
    """A very negative bias on positions 1..29 in every layer: the tokens after them answer as if the text held
    only the sink and themselves, at their own positions. (Full attention only: transformers builds the
    reference's sliding-window mask by index, not by the position ids.)"""
    model = _tiny(kind)
    route_attention("sdpa")
    ids = _ids()
    kept = torch.tensor([0] + list(range(30, TOKENS)))
    with torch.no_grad():
        closed = model(input_ids=ids, **{KEY_BIAS_KEYWORD: _bias(model, -1e4)}).logits[:, 30:]
        without = model(input_ids=ids[:, kept], position_ids=kept[None]).logits[:, 1:]
        plain = model(input_ids=ids).logits[:, 30:]
    torch.testing.assert_close(closed, without, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(plain, without, atol=1e-3)


@pytest.mark.parametrize("kind", MODELS)
def test_gates_learn_by_gradient_and_act_per_layer(kind):
    model = _tiny(kind)
    route_attention("sdpa")
    ids = _ids()
    layers = model.config.num_hidden_layers
    with torch.no_grad():
        plain = model(input_ids=ids, output_hidden_states=True)
    bias = _bias(model, 0.0)
    gates = bias.bias.clone().requires_grad_(True)
    logits = model(input_ids=ids, **{KEY_BIAS_KEYWORD: KeyBias(gates, bias.translated)}).logits
    logits[0, -1].logsumexp(-1).backward()
    assert gates.grad is not None and gates.grad.abs().sum(-1).gt(0).sum() >= layers - 1
    with torch.no_grad():  # a bias on the top layer alone: every layer below computes what it did without
        top = model(input_ids=ids, output_hidden_states=True,
                    **{KEY_BIAS_KEYWORD: _bias(model, -2.0, layers=[layers - 1])})
    torch.testing.assert_close(top.hidden_states[layers - 1], plain.hidden_states[layers - 1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(top.logits[:, 30:], plain.logits[:, 30:], atol=1e-4)


def test_a_translator_s_gates_skip_the_layers_that_hold_the_target_s_own_kv():
    cfg = TranslatorConfig(kind="mot", source_layers=4, source_kv_dim=16, target_layers=6, target_heads=1,
                           target_head_dim=8, target_embed_dim=16, width=8, expert_hidden=8, token_dim=8)
    translated = torch.tensor([False, True, True])
    assert TranslatorNet(cfg).gate is None and TranslatorNet(cfg).key_bias(translated) is None
    net = TranslatorNet(TranslatorConfig(**{**cfg.__dict__, "gate_heads": 3}))
    assert net.gate.shape == (6, 3) and not net.gate.any()  # closed to nothing at first
    with torch.no_grad():
        net.gate.fill_(-1.0)
    exact = net.key_bias(translated)  # layer 0 (native_layers) comes exactly from the embeddings
    assert exact.bias[0].eq(0).all() and exact.bias[1:].eq(-1).all() and exact.translated is translated
    repaired = net.key_bias(translated, exact_layers=2)  # e.g. the blend's two jointly prefilled layers
    assert repaired.bias[:2].eq(0).all() and repaired.bias[2:].eq(-1).all()
    over = repaired.over(layer=3, end=5, keys=4)  # a window of the keys at positions 1..4: 1 and 2 translated
    assert over.tolist() == [[-1.0, -1.0, 0.0, 0.0]] * 3
