"""Compressed KV (int8, int4): codes and scales round-trip within their step, take the bytes they claim, live in
the store under the chunk's checksum, and a document placed from them stays close to native prefill."""

from __future__ import annotations

import json

import pytest
import torch

from cagkit.config import KV_DTYPES
from cagkit.kv.quant import KEY_GROUP, REFINED_KEY_LAYERS, bytes_per_value, dequantize, quantize


def _kv(L=3, T=150, H=2, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a few key channels of large magnitude, as pre-RoPE keys have: per-channel scales keep them from
    # swamping the rest
    keys = torch.randn(L, T, H, D, generator=g) * torch.where(torch.arange(D) % 16 == 0, 30.0, 1.0)
    values = torch.randn(L, T, H, D, generator=g)
    return keys, values


@pytest.mark.parametrize("dtype,bits", [("int8", 8), ("int4", 4)])
@pytest.mark.parametrize("T", [1, 63, 64, 150])
def test_codes_decode_within_half_a_step_of_the_original(dtype, bits, T):
    keys, values = _kv(T=T)
    t = quantize(keys, values, dtype)
    k, v = dequantize(t)
    assert k.shape == keys.shape and v.shape == values.shape and k.dtype == torch.float32
    assert t["keys"].dtype == torch.uint8 and t["keys"].shape[-1] == 64 * bits // 8
    # each key channel's error is bounded by half its own group's step (plus float16 rounding of scale and
    # minimum), so the large channels do not widen the small ones' steps
    groups = -(-T // KEY_GROUP)
    step = t["keys.scale"].float().repeat_interleave(KEY_GROUP, 1)[:, :T]
    assert t["keys.scale"].shape == (3, groups, 2, 64)
    assert ((k - keys).abs() <= step * 0.5 + 1e-2 * keys.abs() + 1e-3).all()
    vstep = t["values.scale"].float()
    assert ((v - values).abs() <= vstep * 0.5 + 1e-2 * values.abs() + 1e-3).all()
    small = torch.arange(64) % 16 != 0
    err = (k - keys)[..., small].norm() / keys[..., small].norm()
    assert err < (0.01 if bits == 8 else 0.15)


def test_a_constant_group_decodes_exactly():
    keys = torch.full((2, 70, 1, 8), 0.5)
    values = torch.zeros(2, 70, 1, 8)
    k, v = dequantize(quantize(keys, values, "int4"))
    assert torch.equal(k, keys) and torch.equal(v, values)


def test_the_bytes_per_value_stated_are_what_the_tensors_take():
    keys, values = _kv(L=24, T=4 * KEY_GROUP)
    for dtype in ("int8", "int4"):
        t = quantize(keys, values, dtype)
        stored = sum(x.numel() * x.element_size() for name, x in t.items() if name not in ("quant", "keys.fine_layers"))
        assert stored == bytes_per_value(dtype, 24) * 2 * keys.numel()
    assert stored > KV_DTYPES["int4"] * 2 * keys.numel()  # the refined keys' second codes
    assert bytes_per_value("int4", 24) / KV_DTYPES["float16"] < 0.30  # qwen's layers


def test_int4_refines_the_keys_of_the_layers_it_would_get_most_wrong():
    keys, values = _kv(L=5, T=150)
    keys[3, ::50] *= 20  # one layer with a few spikes, which widen its groups' ranges for every other token
    t = quantize(keys, values, "int4")
    assert t["keys.fine"].shape == (REFINED_KEY_LAYERS, 150, 2, 32) and t["keys.fine"].dtype == torch.uint8
    layers = t["keys.fine_layers"].tolist()
    assert 3 in layers and len(layers) == REFINED_KEY_LAYERS == 2
    plain = {n: x for n, x in t.items() if not n.startswith("keys.fine")}  # as a reader without refinement reads
    refined, coarse = dequantize(t)[0], dequantize(plain)[0]
    as_int8 = dequantize(quantize(keys, values, "int8"))[0]

    def error(k, layer):
        return float((k[layer] - keys[layer]).norm() / keys[layer].norm())

    for layer in range(5):
        if layer in layers:  # about int8's precision, an order of magnitude under int4's
            assert error(refined, layer) < 1.5 * error(as_int8, layer) < 0.2 * error(coarse, layer)
        else:
            assert torch.equal(refined[layer], coarse[layer])
    # the refined layers are those int4 gets most wrong
    assert min(error(coarse, layer) for layer in layers) >= max(error(coarse, l) for l in range(5) if l not in layers)


@pytest.fixture(scope="module")
def smollm2():
    from cagkit.models.loading import load_model

    return load_model("smollm2")


@pytest.fixture(scope="module")
def stores(smollm2, tmp_path_factory):
    """One short document ingested whole by SmolLM2 into a float32, an int8 and an int4 store."""
    from cagkit.ingest.pipeline import ingest_texts

    text = " ".join(f"The lamp numbered {i} in the harbour of Kerrow burns for {i % 7 + 2} hours each night." for i in range(40))
    out = {}
    for dtype in ("float32", "int8", "int4"):
        out[dtype] = tmp_path_factory.mktemp(dtype) / "st"
        ingest_texts([("doc", text)], store=out[dtype], source="smollm2", chunk_tokens=64, dtype=dtype,
                     progress=False)
    return out


def test_a_compressed_store_reads_back_close_to_float32_and_is_smaller(stores):
    from cagkit.store.store import Store

    kv = {}
    for dtype, path in stores.items():
        with Store.open(path) as st:
            assert st.settings.dtype == dtype
            chunks = st.load_chunks(st.chunk_ids("doc"))
            kv[dtype] = (torch.cat([c.kv.keys.float() for c in chunks], 1),
                         torch.cat([c.kv.values.float() for c in chunks], 1))
            kv[dtype + " info"] = st.summary()
            assert st.verify()["ok"]
    for dtype, bound in (("int8", 0.01), ("int4", 0.15)):
        for got, want in zip(kv[dtype], kv["float32"]):
            assert (got - want).norm() / want.norm() < bound
    per_token = {d: kv[d + " info"]["kv_bytes_per_token"] for d in stores}
    assert per_token["int4"] < per_token["int8"] < 0.6 * per_token["float32"]


def test_a_changed_scale_is_damage_that_verify_finds(stores, tmp_path):
    import shutil

    from cagkit.store.kvfile import KVFile
    from cagkit.store.store import Store

    path = tmp_path / "st"
    shutil.copytree(stores["int4"], path)
    with Store.open(path) as st:
        doc = st.document("doc")
        file = path / "kv" / st.kv_files(doc)[0]
    kv = KVFile(file)
    _, _, begin, _ = kv.tensors["0.keys.scale"]
    data = bytearray(file.read_bytes())
    data[kv.data_start + begin] ^= 0x40
    file.write_bytes(bytes(data))
    with Store.open(path) as st:
        report = st.verify()
    assert not report["ok"] and report["damaged"] == ["doc"]
    assert any("checksum" in p for d in report["documents"] for p in d["problems"])


@torch.no_grad()
def test_a_document_placed_from_int8_or_int4_stays_near_native(stores, smollm2):
    """SmolLM2's next-token distribution after the document placed from each store, against native
    prefill of the same prompt: float32 equal, int8 within 0.01 in total variation, int4 within 0.1 (0.002 and 0.02 when
    written; shifting the values by one token gives 0.84), and the same next token."""
    from cagkit.ask import build_context_cache, choose_scope
    from cagkit.config import AS_STORED
    from cagkit.generation import prompt_parts
    from cagkit.store.store import Store

    question = "How many hours does lamp 12 of Kerrow burn each night?"
    dist = {}
    for dtype, path in stores.items():
        with Store.open(path) as st:
            placed, scope, _ = choose_scope(st, st.document_hits("doc")[:1], "document", 4000)
            ids = [t for x in st.token_ids([h.chunk_id for h in placed]) for t in x]
            context = build_context_cache(smollm2, st, placed, question, "stored", AS_STORED, scope="document")
        logits = smollm2.model(input_ids=torch.tensor([context.pending_ids]), cache=context.cache,
                                  use_cache=True).logits[0, -1]
        dist[dtype] = logits.softmax(-1)
    prefix, suffix = prompt_parts(smollm2, question)
    native = smollm2.model(input_ids=torch.tensor([prefix + ids + suffix])).logits[0, -1].softmax(-1)
    tv = {d: 0.5 * (p - native).abs().sum().item() for d, p in dist.items()}
    assert tv["float32"] < 1e-4 and tv["int8"] < 0.01 and tv["int4"] < 0.1, tv
    assert all(p.argmax() == native.argmax() for p in dist.values())



def test_store_info_json_gives_kv_bytes_per_token(stores, capsys):
    from cagkit.cli import main

    assert main(["store", "info", "--store", str(stores["int4"]), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["settings"]["dtype"] == "int4" and info["kv_bytes_per_token"] > 0
    assert main(["store", "info", "--store", str(stores["int4"])]) == 0
    assert "KV bytes a token" in capsys.readouterr().out


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_an_odd_head_width_round_trips(dtype):
    keys, values = _kv(T=70, D=63)
    k, v = dequantize(quantize(keys, values, dtype))
    assert k.shape == keys.shape and v.shape == values.shape
    small = torch.arange(63) % 16 != 0
    assert (k - keys)[..., small].norm() / keys[..., small].norm() < (0.01 if dtype == "int8" else 0.15)
