"""Document caches are exact: a document ingested whole (`prefill="document"`) and placed from the store at
document scope gives the logits of native prefill of the same prompt, for a Llama (chat prompt), a Gemma 3
(sliding-window layers, two RoPE bases) and a Qwen2; past the window it gives StreamingLLM's cache, checked
against a plain reimplementation with transformers' own cache."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from cagkit.ingest import pipeline
from cagkit.ask import build_context_cache, choose_scope
from cagkit.generation import context_prefix, prompt_parts
from cagkit.ingest.pipeline import ingest_texts
from cagkit.kv.prefill import SINK_TOKENS, DocumentPrefill, prefill_kv
from cagkit.kv.rope import RotaryTables, apply_rope, remove_rope
from cagkit.models.loading import LoadedModel, register_loaded
from cagkit.store.store import Store

SENTENCES = [
    "The lighthouse on Kerrow Point was built in 1871 by the engineer Mara Ellison.",
    "It is 41 metres tall, and its lamp could be seen from thirty kilometres out at sea.",
    "Its keeper in 1902 was Tomas Brandt, who kept a diary of every ship that passed the point.",
    "The diary was found in 1988 in a tin box under the floor of the keeper's cottage.",
    "Ellison also designed the harbour wall at Dunmore, which still stands today.",
]
DOCUMENT = "\n\n".join(" ".join(SENTENCES[i:] + SENTENCES[:i]) for i in range(5))  # about 5 x 100 tokens
QUESTION = "Who kept the diary?"


@pytest.fixture(scope="module")
def tiny_qwen(smollm2_tokenizer) -> LoadedModel:
    """A 3-layer random Qwen2 (biased QKV projections) with the SmolLM2 tokenizer and chat template."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(2)
    config = Qwen2Config(num_hidden_layers=3, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(smollm2_tokenizer), max_position_embeddings=4096,
                         bos_token_id=smollm2_tokenizer.bos_token_id, eos_token_id=smollm2_tokenizer.eos_token_id)
    lm = LoadedModel(name="tiny-qwen", model=Qwen2ForCausalLM(config).eval(), tokenizer=smollm2_tokenizer,
                     fingerprint="tiny-qwen-fp", chat=True)
    register_loaded("tiny-qwen", lm)
    return lm


@pytest.fixture(params=["tiny_llama", "tiny_gemma", "tiny_qwen"])
def lm(request) -> LoadedModel:
    return request.getfixturevalue(request.param)


def _ingest(lm, store, monkeypatch, window=None, part_tokens=96, before=()):
    """Ingest DOCUMENT as "doc", after the documents `before` ((name, text) pairs)."""
    monkeypatch.setattr(pipeline, "PART_TOKENS", part_tokens)  # several parts, each after the ones before it
    return ingest_texts([*before, ("doc", DOCUMENT)], store=store, source=lm.name, chunk_tokens=24,
                        dtype="float32", progress=False, window=window)


@torch.no_grad()
def test_document_placed_whole_gives_native_logits(lm, tmp_path, monkeypatch):
    """Also after another document: the prompt prefix is prefilled once for the run and its KV reused."""
    from cagkit.models.architecture import decoder_stack

    store = tmp_path / "st"
    lm.model.__dict__.pop("_cagkit_prefix_kv", None)  # the per-model memo, as a fresh process has it
    prefix_runs = []  # passes through the decoder over the prompt prefix alone
    hook = decoder_stack(lm.model).register_forward_pre_hook(
        lambda module, args, kwargs: prefix_runs.append(1)
        if kwargs["input_ids"][0].tolist() == context_prefix(lm) else None, with_kwargs=True)
    try:
        _ingest(lm, store, monkeypatch, before=[("first", SENTENCES[0])])
    finally:
        hook.remove()
    assert len(prefix_runs) == 1  # for two documents
    with Store.open(store) as st:
        doc = st.document("doc")
        assert (doc.prefill, doc.window) == ("document", 4096)
        hits = st.document_hits("doc")[2:3]  # one retrieved chunk; its document is placed whole
        placed, scope, left_out = choose_scope(st, hits, "document", 4000)
        assert scope == "document" and not left_out and len(placed) == doc.n_chunks >= 5
        assert [h.idx for h in placed] == list(range(doc.n_chunks))
        stored_ids = [t for ids in st.token_ids([h.chunk_id for h in placed]) for t in ids]
        # the chunks' tokens together are the whole text's, the text between chunks included
        assert stored_ids == lm.tokenizer(DOCUMENT, add_special_tokens=False)["input_ids"]
        files = {f for d in st.documents() for f in st.kv_files(d)}
        assert len(files) >= 3  # written in several parts
        context = build_context_cache(lm, st, placed, QUESTION, "stored", _as_stored(), scope="document")
    placed_logits = lm.model(input_ids=torch.tensor([context.pending_ids]), cache=context.cache,
                             use_cache=True).logits[0, -1]
    prefix, suffix = prompt_parts(lm, QUESTION)
    assert context.pending_ids == suffix
    native = lm.model(input_ids=torch.tensor([prefix + stored_ids + suffix])).logits[0, -1]
    assert torch.allclose(placed_logits, native, atol=1e-4, rtol=1e-4), (placed_logits - native).abs().max()
    # the same store read at chunk scope (chunks at new positions, blind to the rest) is not the native cache
    with Store.open(store) as st:
        some = placed[1:3]
        apart = build_context_cache(lm, st, some, QUESTION, "stored", _as_stored(), scope="chunks")
    assert apart.context_tokens < context.context_tokens


def _as_stored():
    from cagkit.config import AS_STORED

    return AS_STORED


@torch.no_grad()
def test_past_the_window_the_cache_slides_with_a_sink(lm, tmp_path, monkeypatch):
    """A window of 220 tokens over a document of about 500: each part attends to the prefix, the document's first
    SINK_TOKENS tokens and the latest tokens, at consecutive positions; checked against the same rule written
    plainly over transformers' cache."""
    store = tmp_path / "st"
    window = len(context_prefix(lm)) + SINK_TOKENS + 4 * (24 + 8)
    _ingest(lm, store, monkeypatch, window=window)
    with Store.open(store) as st:
        doc = st.document("doc")
        assert doc.window == window
        chunks = st.load_chunks(st.chunk_ids("doc"))
    assert all(c.context[1:] == (len(context_prefix(lm)), window, SINK_TOKENS) for c in chunks)
    assert [c.position for c in chunks] == [sum(len(x.token_ids) for x in chunks[:i]) for i in range(len(chunks))]
    parts = _parts_of(chunks, DocumentPrefill(lm.model, context_prefix(lm), window).room)
    expected = _streaming_reference(lm.model, context_prefix(lm), [ids for ids, _ in parts], window)
    assert sum(len(ids) for ids, _ in parts) > window  # the document outgrew its window
    for (ids, members), (keys, values) in zip(parts, expected, strict=True):
        got_k = torch.cat([c.kv.keys for c in members], 1)
        got_v = torch.cat([c.kv.values for c in members], 1)
        assert torch.allclose(got_k, keys, atol=1e-4) and torch.allclose(got_v, values, atol=1e-4)


def _parts_of(chunks, room):
    """The parts the pipeline prefilled: consecutive chunks up to `room` tokens (as `pipeline._parts` cuts them)."""
    out, part, total = [], [], 0
    for c in chunks:
        if part and total + len(c.token_ids) > min(room, pipeline.PART_TOKENS):
            out.append(([t for x in part for t in x.token_ids], part))
            part, total = [], 0
        part.append(c)
        total += len(c.token_ids)
    out.append(([t for x in part for t in x.token_ids], part))
    return out


def _streaming_reference(model, prefix, parts, window):
    """StreamingLLM's prefill written plainly: keep the prefix and the first SINK_TOKENS document tokens, drop the
    oldest others so that the kept tokens and the next part fit `window`, re-rotate the kept keys to positions
    0..K-1, run the part at K.. . Returns each part's RoPE-free (keys, values) [L, T, H, D]."""
    tables = RotaryTables(model)
    kept_k, kept_v = [], []  # per token: [L, H, D] RoPE-free
    if prefix:
        kv = prefill_kv(model, prefix)
        kept_k, kept_v = list(kv.keys.unbind(1)), list(kv.values.unbind(1))
    sink = len(prefix) + SINK_TOKENS
    out = []
    for ids in parts:
        over = len(kept_k) + len(ids) - window
        if over > 0:
            del kept_k[sink:sink + over], kept_v[sink:sink + over]
        start = len(kept_k)
        cache = DynamicCache()
        if start:
            keys, values = torch.stack(kept_k, 1), torch.stack(kept_v, 1)
            for layer in range(keys.shape[0]):
                cos, sin = tables(layer, torch.arange(start))
                cache.update(apply_rope(keys[layer], cos, sin).transpose(0, 1)[None],
                             values[layer].transpose(0, 1)[None], layer)
        model(input_ids=torch.tensor([ids]), position_ids=torch.arange(start, start + len(ids))[None], cache=cache,
              use_cache=True)
        keys, values = [], []
        for layer, cached in enumerate(cache.layers):
            cos, sin = tables(layer, torch.arange(start, start + len(ids)))
            keys.append(remove_rope(cached.keys[0, :, start:].transpose(0, 1), cos, sin))
            values.append(cached.values[0, :, start:].transpose(0, 1))
        keys, values = torch.stack(keys), torch.stack(values)
        out.append((keys, values))
        kept_k += list(keys.unbind(1))
        kept_v += list(values.unbind(1))
    return out
