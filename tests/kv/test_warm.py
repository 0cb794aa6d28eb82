"""Warm document caches: a second question on the same documents starts from a copy of the placed context and
answers as a cold one does; the LRU keeps within its bytes; a question-dependent placement is never kept."""

from __future__ import annotations

import pytest
import torch

from cagkit.ask import answer_from_chunks, build_context_cache, choose_scope
from cagkit.config import AS_STORED, Placement
from cagkit.ingest.pipeline import ingest_texts
from cagkit.kv.warm import WarmCaches, WarmContext, cache_bytes
from cagkit.store.store import Store

TEXT = " ".join(f"Pier {i} of the old harbour at Kerrow was rebuilt in {1900 + 3 * i}." for i in range(30))


@pytest.fixture(scope="module")
def store(tiny_llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("warm") / "st"
    ingest_texts([("harbour", TEXT), ("other", TEXT.replace("Pier", "Gate"))], store=path, source="tiny-llama",
                 chunk_tokens=48, dtype="float32", progress=False)
    return path


def _answer(lm, st, question, warm, placement=AS_STORED):
    hits, _, _ = choose_scope(st, st.document_hits("harbour")[:1], "document", 4000, "stored")
    return answer_from_chunks(lm, st, hits, question, "stored", 6, placement=placement, scope="document", warm=warm)


def test_a_second_question_on_warm_documents_reads_nothing_and_answers_as_cold(tiny_llama, store):
    warm = WarmCaches(1 << 30)
    with Store.open(store) as st:
        cold = _answer(tiny_llama, st, "When was pier 4 rebuilt?", None)
        first = _answer(tiny_llama, st, "When was pier 4 rebuilt?", warm)
        second = _answer(tiny_llama, st, "When was pier 7 rebuilt?", warm)
        again = _answer(tiny_llama, st, "When was pier 4 rebuilt?", warm)
        other_cold = _answer(tiny_llama, st, "When was pier 7 rebuilt?", None)
    assert (first.warm, second.warm, again.warm) == (False, True, True)
    assert first.answer == cold.answer == again.answer and second.answer == other_cold.answer
    assert second.timings["load_ms"] < first.timings["load_ms"]  # nothing read; its place_ms is the copy
    assert len(warm) == 1 and warm.hits == 2 and warm.misses == 1
    assert warm.nbytes > 0


def test_a_warm_context_is_the_cold_one_and_questions_do_not_change_it(tiny_llama, store):
    warm = WarmCaches(1 << 30)
    with Store.open(store) as st:
        hits, _, _ = choose_scope(st, st.document_hits("harbour")[:1], "document", 4000, "stored")
        cold = build_context_cache(tiny_llama, st, hits, "q?", "stored", AS_STORED, "document")
        first = build_context_cache(tiny_llama, st, hits, "q?", "stored", AS_STORED, "document", warm=warm)
        tiny_llama.model(input_ids=torch.tensor([first.pending_ids]), cache=first.cache, use_cache=True)
        got = build_context_cache(tiny_llama, st, hits, "q?", "stored", AS_STORED, "document", warm=warm)
    assert not first.warm and got.warm and got.context_tokens == cold.context_tokens
    (entry,) = warm._entries.values()
    assert all(a.keys.data_ptr() == b.keys.data_ptr() for a, b in zip(entry.cache.layers, got.cache.layers))  # no copy
    tiny_llama.model(input_ids=torch.tensor([got.pending_ids]), cache=got.cache, use_cache=True)  # extends the copy
    assert entry.cache.get_seq_length() == cold.cache.get_seq_length() < got.cache.get_seq_length()
    for a, b in zip(entry.cache.layers, cold.cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_a_placement_that_depends_on_the_question_is_not_kept(tiny_llama, store):
    warm = WarmCaches(1 << 30)
    with Store.open(store) as st:
        _answer(tiny_llama, st, "When was pier 4 rebuilt?", warm, Placement(0, 0.3, "question"))
    assert len(warm) == 0


def test_the_lru_keeps_within_its_bytes_and_evicts_the_least_recently_used(tiny_llama, store):
    with Store.open(store) as st:
        hits, _, _ = choose_scope(st, st.document_hits("harbour")[:1], "document", 4000, "stored")
        size = cache_bytes(build_context_cache(tiny_llama, st, hits, "q?", "stored", AS_STORED, "document").cache)
    warm = WarmCaches(2 * size + size // 2)  # room for two
    for key in ("a", "b"):
        warm.put((key,), WarmContext(_cache(size), 0, "reuse", {}, [], size))
    assert warm.get(("a",)) is not None  # a is now the most recently used
    warm.put(("c",), WarmContext(_cache(size), 0, "reuse", {}, [], size))
    assert set(warm._entries) == {("a",), ("c",)} and warm.nbytes <= warm.max_bytes
    warm.put(("huge",), WarmContext(_cache(size), 0, "reuse", {}, [], 3 * size))  # over the bound: not kept
    assert ("huge",) not in warm._entries
    assert len(WarmCaches(0)) == 0
    with pytest.raises(ValueError):
        WarmCaches(-1)


def _cache(nbytes):
    from transformers import DynamicCache

    cache = DynamicCache()
    n = max(1, nbytes // 8)
    cache.update(torch.zeros(1, 1, n, 1), torch.zeros(1, 1, n, 1), 0)
    return cache


def test_a_model_unloaded_by_the_server_takes_its_warm_contexts_with_it(monkeypatch):
    """The server's pool of one loaded model: loading the second unloads the first, and the contexts kept for the
    first (keyed by its name) go; the second's stay."""
    from types import SimpleNamespace

    from cagkit.serve import models as pool_module
    from cagkit.serve.models import ModelPool

    monkeypatch.setattr(pool_module, "load_model", lambda name, device=None: SimpleNamespace(name=f"{name}-display"))
    monkeypatch.setattr(pool_module, "unload_model", lambda name, device=None: None)
    warm = WarmCaches(1 << 20)
    for model in ("alpha-display", "alpha-display", "beta-display"):
        warm.put((model, len(warm)), WarmContext(_cache(64), 0, "stored", {}, [], 64))
    pool = ModelPool(("alpha", "beta"), 1, on_unload=lambda lm: warm.drop_model(lm.name))
    try:
        pool.submit("alpha", lambda lm: None).result()
        assert len(warm) == 3
        pool.submit("beta", lambda lm: None).result()  # alpha goes to make room
        assert pool.loaded() == ["beta"] and [key[0] for key in warm._entries] == ["beta-display"]
    finally:
        pool.close()
    assert warm.drop_model("nobody") == 0
