"""The flash layout `[B, T, H, D]` and transformers' cache layout `[B, H, T, D]` give the same attention as a
plain reference implementation, sliding windows included; flash-attn itself is checked where CUDA has it."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_gemma3, make_tiny_llama

from cagkit.kv.attention import attention, flash_attn_available, layer_kv, reference_attention
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefix_cache
from cagkit.kv.rope import RotaryTables
from cagkit.models.architecture import sliding_window


def _qkv(b=2, tq=5, tk=23, hq=4, hk=2, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, tq, hq, d, generator=g), torch.randn(b, tk, hk, d, generator=g),
            torch.randn(b, tk, hk, d, generator=g))


@pytest.mark.parametrize("causal,window", [(True, None), (True, 7), (False, None)])
def test_flash_layout_attention_matches_reference(causal, window):
    q, k, v = _qkv()
    torch.testing.assert_close(attention(q, k, v, causal, window), reference_attention(q, k, v, causal, window),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("hq,hk", [(4, 4), (4, 1), (6, 2)])
def test_sdpa_shares_kv_heads_as_the_reference_does(hq, hk):
    q, k, v = _qkv(hq=hq, hk=hk)
    torch.testing.assert_close(attention(q, k, v, backend="sdpa"), reference_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_uneven_head_groups_are_refused():
    q, k, v = _qkv(hq=3, hk=2)
    with pytest.raises(ValueError, match="3 query heads cannot share 2 KV heads"):
        attention(q, k, v, backend="sdpa")


def test_reference_masks_what_it_should():
    q, k, v = _qkv(b=1, tq=1, tk=6, hq=2, hk=2)
    # One query at the last position with a window of 1 sees only its own key: the output is that key's value.
    torch.testing.assert_close(reference_attention(q, k, v, True, 1), v[:, -1:], atol=1e-6, rtol=1e-6)
    # Changing keys outside the window leaves the output unchanged; inside it, it does not.
    k2 = k.clone()
    k2[:, 0] += 5.0
    torch.testing.assert_close(reference_attention(q, k2, v, True, 3), reference_attention(q, k, v, True, 3))
    assert not torch.allclose(reference_attention(q, k2, v, True, None), reference_attention(q, k, v, True, None))


# (query heads, KV heads, head dim, window): a small case, then the three models' own attention shapes.
CUDA_SHAPES = [(4, 2, 16, None), (4, 2, 16, 7), (9, 3, 64, None), (14, 2, 64, None), (4, 1, 256, None),
               (4, 1, 256, 512)]
CUDA_IDS = ["small", "small-window", "smollm2", "qwen", "gemma-full", "gemma-sliding"]


@pytest.mark.skipif(not flash_attn_available("cuda"), reason="needs CUDA and flash-attn (pip install 'cagkit[gpu]')")
@pytest.mark.parametrize("hq,hk,d,window", CUDA_SHAPES, ids=CUDA_IDS)
def test_flash_attn_matches_reference_on_cuda(hq, hk, d, window):
    q, k, v = (t.cuda().bfloat16() for t in _qkv(tq=5, tk=1000, hq=hq, hk=hk, d=d))
    out = attention(q, k, v, True, window, backend="flash")
    assert out.shape == q.shape and out.is_cuda
    torch.testing.assert_close(out.float(), reference_attention(q, k, v, True, window).float(), atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("hq,hk,d,window", CUDA_SHAPES, ids=CUDA_IDS)
def test_sdpa_on_cuda_matches_reference(hq, hk, d, window):
    q, k, v = (t.cuda() for t in _qkv(tq=5, tk=1000, hq=hq, hk=hk, d=d))
    out = attention(q, k, v, True, window, backend="sdpa")
    assert out.is_cuda
    torch.testing.assert_close(out, reference_attention(q, k, v, True, window), atol=5e-4, rtol=5e-4)


def test_attention_backends_are_checked():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="unknown attention backend"):
        attention(q, k, v, backend="triton")
    with pytest.raises(RuntimeError, match="needs CUDA tensors and flash-attn"):
        attention(q, k, v, backend="flash")  # CPU tensors


@pytest.mark.parametrize("make", [make_tiny_llama, make_tiny_gemma3], ids=["llama", "gemma3"])
def test_placed_chunks_attend_alike_in_both_layouts(make, smollm2_tokenizer):
    """Chunks placed into transformers' cache (sliding layers keep their last window) and the same chunks in the
    flash layout (all keys, window mask) give one question token the same attention output as the reference."""
    model = make(smollm2_tokenizer)
    config = model.config
    layers, heads, kv_heads = config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    g = torch.Generator().manual_seed(1)
    chunks = [ChunkKV(torch.randn(layers, n, kv_heads, dim, generator=g), torch.randn(layers, n, kv_heads, dim, generator=g))
              for n in (9, 14)]
    prefix_ids = smollm2_tokenizer("Context:", add_special_tokens=False)["input_ids"]
    tables = RotaryTables(model)
    cache = prefix_cache(model, prefix_ids)
    prefix_kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    place_chunks(model, cache, chunks, tables)
    p, n = len(prefix_ids), sum(c.num_tokens for c in chunks)
    for layer in range(layers):
        window = sliding_window(config, layer)
        # Flash layout: the prefix's keys (transposed out of the cache) then the placed chunks, every token kept.
        ck, cv = layer_kv(chunks, layer, tables, start=p)
        fk = torch.cat([prefix_kv[layer][0].transpose(1, 2), ck], dim=1)
        fv = torch.cat([prefix_kv[layer][1].transpose(1, 2), cv], dim=1)
        assert fk.shape[1] == p + n
        # Cache layout: what transformers kept ([B, H, T, D]); a sliding layer holds fewer tokens than p + n.
        tk, tv = cache.layers[layer].keys.transpose(1, 2), cache.layers[layer].values.transpose(1, 2)
        if window is None:
            torch.testing.assert_close(tk, fk, atol=1e-5, rtol=1e-5)
        else:
            assert tk.shape[1] < p + n
            torch.testing.assert_close(tk, fk[:, -tk.shape[1]:], atol=1e-5, rtol=1e-5)
        # One question token at position p + n: its own key/value joins both, then it attends.
        q = torch.randn(1, 1, heads, dim, generator=g)
        own_k, own_v = torch.randn(1, 1, kv_heads, dim, generator=g), torch.randn(1, 1, kv_heads, dim, generator=g)
        flash_k, flash_v = torch.cat([fk, own_k], 1), torch.cat([fv, own_v], 1)
        expected = reference_attention(q, flash_k, flash_v, causal=True, window=window)
        from_flash = attention(q, flash_k, flash_v, causal=True, window=window)
        from_cache = attention(q, torch.cat([tk, own_k], 1), torch.cat([tv, own_v], 1), causal=True)
        torch.testing.assert_close(from_flash, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(from_cache, expected, atol=1e-5, rtol=1e-5)
