"""Retrieval: BM25 against a hand computation, reciprocal rank fusion, the store's modes and document filter, and
the example documents' own question, which the embedder alone misses."""

import math
from pathlib import Path

import numpy as np
import pytest

from cagkit.errors import CagkitError
from cagkit.ingest.pipeline import ingest
from cagkit.retrieval.lexical import LexicalIndex, terms
from cagkit.retrieval.rank import RRF_K, rank
from cagkit.retrieval.search import retrieve
from cagkit.store.store import Store

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "docs"


def test_terms_are_lower_cased_words_of_any_script_without_stopwords():
    assert terms("What is the Seine's length, in 2024? Ålesund ÉCOLE") == ["seine", "s", "length", "2024",
                                                                          "ålesund", "école"]
    assert terms("the of and") == []


def test_bm25_matches_a_hand_computation():
    texts = ["lighthouse keeper lighthouse", "bakery oven", "keeper of the bakery oven and the lighthouse"]
    index = LexicalIndex(texts)
    lengths = [3, 2, 4]  # stopwords ("of", "the", "and") are not counted
    mean = sum(lengths) / 3

    def part(tf, length, df):
        idf = math.log(1 + (3 - df + 0.5) / (df + 0.5))
        return idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / mean))

    expected = [part(2, 3, 2) + part(1, 3, 2), 0.0, part(1, 4, 2) + part(1, 4, 2)]
    np.testing.assert_allclose(index.scores("Where is the lighthouse keeper?"), expected, rtol=1e-12)
    assert index.scores("oven")[1] > index.scores("oven")[2] > 0  # the same count weighs more in a shorter text
    assert not index.scores("the of").any() and not index.scores("zeppelin").any()
    assert LexicalIndex([]).scores("anything").shape == (0,)


def test_rank_orders_by_each_mode_and_fuses_reciprocal_ranks():
    dense = np.array([0.9, 0.5, 0.1, 0.4])
    lexical = np.array([0.0, 2.0, 7.0, 1.0])
    assert rank(dense, lexical, "dense", 4)[0].tolist() == [0, 1, 3, 2]
    assert rank(dense, lexical, "lexical", 2)[0].tolist() == [2, 1]
    order, scores = rank(dense, lexical, "hybrid", 4)
    # 0-based ranks dense [0, 1, 3, 2] and lexical [3, 1, 0, 2]: chunk 1 is second in both and wins
    fused = {i: (RRF_K + 1) / 2 * (1 / (RRF_K + 1 + d) + 1 / (RRF_K + 1 + w))
             for i, (d, w) in enumerate([(0, 3), (1, 1), (3, 0), (2, 2)])}
    assert order[0] == 1 and scores.tolist() == sorted(scores.tolist(), reverse=True)
    np.testing.assert_allclose(scores, [fused[i] for i in order])
    assert rank(dense, dense, "hybrid", 1)[1].tolist() == [1.0]  # first in both rankings
    with pytest.raises(CagkitError, match="hybrid retrieval needs the question's text"):
        rank(dense, None, "hybrid", 2)
    with pytest.raises(CagkitError, match="--retrieval must be one of hybrid, dense, lexical, got 'bm25'"):
        rank(dense, lexical, "bm25", 2)


@pytest.fixture(scope="module")
def example_store(tiny_llama, tmp_path_factory):
    """The bundled example documents, chunked as `make demo` chunks them (the SmolLM2 tokenizer, 256 tokens)."""
    path = tmp_path_factory.mktemp("examples") / "store"
    ingest([EXAMPLES], store=path, source="tiny-llama", progress=False)
    return path


def test_hybrid_retrieval_ranks_the_demo_s_answer_above_what_the_embedder_prefers(example_store):
    """`make demo` asks how a stored chunk can sit anywhere in a prompt; the answer is the paragraph "Keys without
    positions" of 02-store.md. The embedder ranks other chunks above it (two, as the documents read on
    2026-12-03), BM25 ranks it first, and the fused ranking above where the embedder does."""
    question = "How does cagkit make a stored chunk usable at any position in the prompt?"
    with Store.open(example_store) as st:
        found = {mode: retrieve(st, question, 4, mode) for mode in ("dense", "lexical", "hybrid")}
    answer = "so a stored chunk belongs to no position"
    where = {mode: [answer in h.text for h in hits].index(True) for mode, hits in found.items()}
    assert where["dense"] > 0 and where["lexical"] == 0 and where["hybrid"] < where["dense"]
    assert all(h.score > 0 for h in found["hybrid"])


def test_a_document_filter_ranks_those_documents_as_a_store_of_their_own(example_store):
    with Store.open(example_store) as st:
        paths = [d.path for d in st.documents()]
        commands = [p for p in paths if p.endswith("04-commands.md")]
        for mode in ("dense", "lexical", "hybrid"):
            hits = st.search(np.zeros(384, np.float32) + 0.05, 10, text="store chunk", retrieval=mode,
                             documents=commands)
            assert hits and {h.doc_path for h in hits} == set(commands)
            assert len(hits) == len(st.chunk_ids(commands[0]))  # fewer candidates than top_k: all of them
        # BM25's word statistics are those of the candidates alone, not the whole store's
        own = LexicalIndex([h.text for h in sorted(hits, key=lambda h: h.idx)]).scores("store chunk")
        ranked = st.search(np.zeros(384, np.float32), 10, text="store chunk", retrieval="lexical", documents=commands)
        assert [h.score for h in ranked] == sorted(own.tolist(), reverse=True)
        whole = st.search(np.zeros(384, np.float32), 20, text="store chunk", retrieval="lexical")
        assert {h.score for h in whole if h.doc_path in commands} != {h.score for h in ranked}
        with pytest.raises(CagkitError, match="lexical retrieval needs the question's text"):
            st.search(np.zeros(384, np.float32), 2, retrieval="lexical")


def test_the_embedder_gives_the_vectors_sentence_transformers_gives():
    """cagkit runs all-MiniLM-L6-v2 with transformers alone; its vectors are those of the model's own
    sentence-transformers pipeline (mean pooling, unit length, at most 256 tokens: a longer text is cut)."""
    SentenceTransformer = pytest.importorskip("sentence_transformers").SentenceTransformer
    from cagkit.retrieval.embeddings import _model_dir, embed

    texts = ["The Orlimar lighthouse flashes green every nine seconds.", "x", "word " * 400,
             "Tickets cost twelve euro. Bicycles travel free on weekdays.", ""]
    reference = SentenceTransformer(str(_model_dir()), device="cpu", local_files_only=True).encode(
        texts, batch_size=2, normalize_embeddings=True, show_progress_bar=False)
    ours = embed(texts)
    assert ours.shape == (5, 384) and ours.dtype == np.float32
    assert np.abs(ours - reference).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
