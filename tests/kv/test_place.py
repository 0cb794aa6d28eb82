"""RoPE removal and re-application is exact: a stored chunk placed anywhere equals prefilling it there."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache

from cagkit.ingest.chunking import chunk_text
from cagkit.ingest.pipeline import prefill_chunks
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefill_kv, prefill_kv_batch, prefix_cache
from cagkit.kv.rope import RotaryTables, apply_rope, remove_rope

TEXT = ("The lighthouse on Kerrow Point was built in 1871 by the engineer Mara Ellison. It is 41 metres tall, "
        "and its keeper in 1902 was Tomas Brandt, who kept a diary of every ship that passed the point.")


def _native_reference(model, prefix_ids, chunk_ids, query_ids):
    """Prefix prefilled natively; the chunk prefilled alone at positions p..p+n; then the query. -> cache, logits"""
    cache = prefix_cache(model, prefix_ids)
    p = len(prefix_ids)
    alone = DynamicCache()
    positions = torch.arange(p, p + len(chunk_ids))[None]
    model(input_ids=torch.tensor([chunk_ids]), position_ids=positions, cache=alone, use_cache=True)
    for layer, cached in enumerate(alone.layers):
        cache.update(cached.keys, cached.values, layer)
    logits = model(input_ids=torch.tensor([query_ids]), cache=cache, use_cache=True).logits[0, -1]
    return cache, logits


def _placed(model, prefix_ids, kv, query_ids):
    cache = prefix_cache(model, prefix_ids)
    place_chunks(model, cache, [kv])
    logits = model(input_ids=torch.tensor([query_ids]), cache=cache, use_cache=True).logits[0, -1]
    return cache, logits


def test_remove_rope_inverts_apply_rope():
    torch.manual_seed(0)
    keys = torch.randn(7, 3, 16)
    angles = torch.rand(7, 8) * 50
    # Scaled tables, as RoPE variants with an attention factor produce: removal must undo the scale too.
    cos, sin = 1.3 * torch.cos(angles).repeat(1, 2), 1.3 * torch.sin(angles).repeat(1, 2)
    assert torch.allclose(remove_rope(apply_rope(keys, cos, sin), cos, sin), keys, atol=1e-5)
    assert not torch.allclose(apply_rope(keys, cos, sin), keys, atol=1e-2)


@pytest.mark.parametrize("model_fixture", ["tiny_llama", "tiny_gemma"])
def test_placed_chunk_matches_native_prefill_at_that_position(model_fixture, request):
    lm = request.getfixturevalue(model_fixture)
    tok = lm.tokenizer
    prefix = tok("<|im_start|>user\nContext:", add_special_tokens=False)["input_ids"]
    chunk = tok(TEXT, add_special_tokens=False)["input_ids"]
    query = tok(" Who built it?", add_special_tokens=False)["input_ids"]
    assert len(chunk) > 16  # longer than tiny Gemma's sliding window, so truncation is exercised
    kv = prefill_kv(lm.model, chunk)
    assert kv.keys.shape == (lm.num_layers, len(chunk), lm.num_kv_heads, lm.head_dim)

    ref_cache, ref_logits = _native_reference(lm.model, prefix, chunk, query)
    got_cache, got_logits = _placed(lm.model, prefix, kv, query)
    for ref, got in zip(ref_cache.layers, got_cache.layers):
        assert ref.keys.shape == got.keys.shape
        torch.testing.assert_close(got.keys, ref.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got.values, ref.values, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_logits, ref_logits, atol=1e-4, rtol=1e-4)


def test_sliding_layers_keep_only_their_window(tiny_gemma):
    tok = tiny_gemma.tokenizer
    chunk = tok(TEXT, add_special_tokens=False)["input_ids"]
    cache = prefix_cache(tiny_gemma.model, [])
    place_chunks(tiny_gemma.model, cache, [prefill_kv(tiny_gemma.model, chunk)])
    window = tiny_gemma.config.sliding_window
    lengths = [layer.keys.shape[-2] for layer in cache.layers]
    assert lengths == [window - 1] * 5 + [len(chunk)]
    assert cache.get_seq_length() == len(chunk)


@pytest.mark.parametrize("model_fixture", ["tiny_llama", "tiny_gemma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("prefix", [[], [1, 2, 3]])
def test_placing_several_chunks_writes_apply_rope_s_keys_to_the_bit(model_fixture, dtype, prefix, request):
    """place_chunks writes each layer in place; its keys are `apply_rope` at the chunks' positions, rounded to the
    model's dtype once, and its values the chunks' own, after the prefix, whatever the layer kind."""
    lm = request.getfixturevalue(model_fixture)
    model = copy.deepcopy(lm.model).to(dtype)  # a copy: a round trip through bfloat16 would change the shared model
    model.__dict__.pop("_cagkit_prefix_kv", None)  # the prefix memo holds the dtype the model had
    torch.manual_seed(0)
    shape = (lm.num_layers, 0, lm.num_kv_heads, lm.head_dim)
    chunks = [ChunkKV(torch.randn(*shape[:1], n, *shape[2:]), torch.randn(*shape[:1], n, *shape[2:]))
              for n in (5, 7, 3, 9)]  # 24 tokens, past tiny Gemma's sliding window of 16
    cache = prefix_cache(model, prefix)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers] if prefix else []
    place_chunks(model, cache, chunks)
    tables = RotaryTables(model)
    keys = torch.cat([c.keys for c in chunks], dim=1)
    values = torch.cat([c.values for c in chunks], dim=1)
    positions = torch.arange(len(prefix), len(prefix) + keys.shape[1])
    for i, layer in enumerate(cache.layers):
        want_k = apply_rope(keys[i], *tables(i, positions)).transpose(0, 1)[None].to(dtype)
        want_v = values[i].transpose(0, 1)[None].to(dtype)
        if before:
            want_k = torch.cat([before[i][0], want_k], dim=-2)
            want_v = torch.cat([before[i][1], want_v], dim=-2)
        kept = layer.keys.shape[-2]  # a sliding layer keeps its window's last tokens
        assert layer.keys.dtype == dtype and torch.equal(layer.keys, want_k[:, :, -kept:])
        assert torch.equal(layer.values, want_v[:, :, -kept:])
    assert cache.get_seq_length() == len(prefix) + keys.shape[1]


def test_a_wrong_position_changes_the_logits(tiny_llama):
    """Guards the test above: placing the chunk at another position must not give the same logits."""
    tok = tiny_llama.tokenizer
    chunk = tok(TEXT, add_special_tokens=False)["input_ids"]
    query = tok(" Who built it?", add_special_tokens=False)["input_ids"]
    kv = prefill_kv(tiny_llama.model, chunk)
    shifted = ChunkKV(torch.roll(kv.keys, 1, dims=1), kv.values)
    _, ref = _placed(tiny_llama.model, [1, 2, 3], kv, query)
    _, bad = _placed(tiny_llama.model, [1, 2, 3], shifted, query)
    assert (ref - bad).abs().max() > 1e-3


def test_rotary_tables_differ_per_layer_type(tiny_gemma):
    tables = RotaryTables(tiny_gemma.model)
    positions = torch.arange(100, 104)
    sliding_cos, _ = tables(0, positions)
    full_cos, _ = tables(5, positions)
    assert sliding_cos.shape == (4, tiny_gemma.head_dim)
    assert (sliding_cos - full_cos).abs().max() > 0.1


@pytest.mark.slow
def test_real_smollm2_reuse_is_exact():
    """The real source model: stored (fp32) KV placed after a chat prefix matches native prefill there."""
    from cagkit.models.loading import load_model

    lm = load_model("smollm2")
    tok = lm.tokenizer
    prefix = tok("<|im_start|>user\nContext:\n", add_special_tokens=False)["input_ids"]
    chunk = tok(TEXT, add_special_tokens=False)["input_ids"]
    query = tok("\nWho built the lighthouse?", add_special_tokens=False)["input_ids"]
    _, ref = _native_reference(lm.model, prefix, chunk, query)
    _, got = _placed(lm.model, prefix, prefill_kv(lm.model, chunk), query)
    torch.testing.assert_close(got, ref, atol=2e-3, rtol=1e-3)
    assert int(got.argmax()) == int(ref.argmax())


@pytest.mark.parametrize("model_fixture", ["tiny_llama", "tiny_gemma"])
def test_a_batched_prefill_gives_each_sequence_its_own_kv(model_fixture, request):
    """Right-padded sequences of different lengths (longer than Gemma's 16-token window) prefilled together get
    the KV each gets alone, and ingest's batching gives the chunks it gives one at a time."""
    lm = request.getfixturevalue(model_fixture)
    text = ("The keeper logged every ship that passed the point. Some nights there were none; on others, a dozen "
            "came by before dawn. She wrote each down in copper ink, with its flag and the hour.")
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    sequences = [ids, ids[:7], ids[5:30]]
    together = prefill_kv_batch(lm.model, sequences)
    for seq, kv in zip(sequences, together):
        alone = prefill_kv(lm.model, seq)
        assert kv.keys.shape == alone.keys.shape
        torch.testing.assert_close(kv.keys, alone.keys, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kv.values, alone.values, atol=1e-5, rtol=1e-5)
    chunks = chunk_text(text * 3, lm.count_tokens, 24)
    batched, single = (prefill_chunks(lm, RotaryTables(lm.model), chunks, batch_tokens=b) for b in (80, 0))
    assert len(batched) == len(single) > 3
    for a, b in zip(batched, single):
        assert a.token_ids == b.token_ids and a.offsets == b.offsets
        torch.testing.assert_close(a.kv.keys, b.kv.keys, atol=1e-5, rtol=1e-5)
