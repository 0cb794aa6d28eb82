"""The LlamaIndex classes against llama-index-core itself, over a store prefilled by a tiny random Llama.

Greedy decoding is deterministic, so the query engine must give exactly what `cagkit.ask` gives for the same
settings; a random model's answer is gibberish, but identical gibberish.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from llama_index.core import Document, SimpleDirectoryReader
from llama_index.core.base.response.schema import AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.llms import MockLLM
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import QueryFusionRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from cagkit import Store, ask
from cagkit.errors import CagkitError
from cagkit.integrations.llama_index import CAGQueryEngine, CAGRetriever, ingest_documents
from cagkit.retrieval.embeddings import embed

FACTS = {
    "lighthouse": "The Varnholm lighthouse keeper polishes the brass lens every Tuesday with walnut oil.",
    "bakery": "Mirela's bakery sells exactly forty-two cardamom buns before seven in the morning.",
    "glacier": "The Oskvik glacier retreated nine hundred metres between 1990 and 2020.",
}
FILLER = "This paragraph talks about nothing in particular and only adds length to the document. "


def _documents() -> list[Document]:
    return [
        Document(
            id_=f"notes/{name}.txt",
            text="\n\n".join([FILLER * 2, fact, FILLER * 2]),
            metadata={"topic": name, "pages": [1, 2], "reviewed": name == "bakery"},
        )
        for name, fact in FACTS.items()
    ]


@pytest.fixture(scope="module")
def store(tiny_llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("li") / "store"
    report = ingest_documents(_documents(), store=path, source="tiny-llama", chunk_tokens=32, progress=False)
    assert sorted(report.added) == sorted(f"notes/{n}.txt" for n in FACTS) and report.chunks > len(FACTS)
    return path


def test_retriever_finds_the_chunk_with_the_fact(store):
    nodes = CAGRetriever(store=store, similarity_top_k=3).retrieve("How often is the lighthouse lens polished?")

    assert len(nodes) == 3
    assert FACTS["lighthouse"] in nodes[0].node.get_content()
    scores = [n.score for n in nodes]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] > scores[1]
    meta = nodes[0].node.metadata
    assert meta["doc_path"] == "notes/lighthouse.txt"
    assert meta["topic"] == "lighthouse" and meta["pages"] == [1, 2] and meta["reviewed"] is False
    assert nodes[0].node.ref_doc_id == "notes/lighthouse.txt"
    with Store.open(store) as st:
        stored = st.load_chunk(meta["chunk_id"])
    assert (stored.doc_path, stored.idx, stored.text) == (meta["doc_path"], meta["chunk_index"], nodes[0].node.text)
    for mode in ("dense", "lexical"):  # the default fuses these two rankings
        ranked = CAGRetriever(store=store, similarity_top_k=3, retrieval=mode).retrieve(
            "How often is the lighthouse lens polished?")
        assert FACTS["lighthouse"] in ranked[0].node.get_content()
    with pytest.raises(CagkitError, match="--retrieval must be one of hybrid, dense, lexical, got 'sparse'"):
        CAGRetriever(store=store, retrieval="sparse")


def test_retriever_composes_with_llama_index_engines_and_retrievers(store):
    retriever = CAGRetriever(store=store, similarity_top_k=2)
    question = "How many cardamom buns does the bakery sell?"
    response = RetrieverQueryEngine.from_args(retriever, llm=MockLLM()).query(question)
    assert [n.node.node_id for n in response.source_nodes] == [n.node.node_id for n in retriever.retrieve(question)]
    assert FACTS["bakery"] in response.source_nodes[0].node.get_content()

    fused = QueryFusionRetriever([retriever], llm=MockLLM(), num_queries=1, similarity_top_k=1, use_async=False)
    assert FACTS["bakery"] in fused.retrieve(question)[0].node.get_content()


@pytest.mark.parametrize("mode", ["mot", "native"])
def test_query_engine_answers_exactly_as_cagkit_ask(store, mode):
    question = "How far did the glacier retreat?"
    expected = ask(question, store=store, model="tiny-llama", top_k=2, mode=mode, max_new_tokens=12)
    engine = CAGQueryEngine(CAGRetriever(store=store, similarity_top_k=2), model="tiny-llama", mode=mode,
                            max_new_tokens=12)

    response = engine.query(question)

    assert isinstance(response, Response)
    assert response.response == expected.answer and expected.answer
    assert [(n.node.metadata["doc_path"], n.node.metadata["chunk_index"], round(n.score, 4))
            for n in response.source_nodes] == [(s["document"], s["chunk"], s["score"]) for s in expected.sources]
    assert response.metadata["mode"] == expected.mode == ("reuse" if mode == "mot" else "native")
    assert response.metadata["context_tokens"] == expected.context_tokens > 0


def test_streaming_pieces_join_to_the_answer(store):
    question = "What does the keeper polish the lens with?"
    expected = ask(question, store=store, model="tiny-llama", top_k=2, max_new_tokens=12).answer
    engine = CAGQueryEngine.from_store(store, similarity_top_k=2, model="tiny-llama", max_new_tokens=12,
                                       streaming=True)

    response = engine.query(question)

    assert isinstance(response, StreamingResponse)
    assert response.metadata == {}  # nothing generated until the stream is read
    pieces = list(response.response_gen)
    assert len(pieces) > 1 and "".join(pieces) == expected
    assert response.metadata["model"] == "tiny-llama" and response.metadata["timings"]["ttft_ms"] > 0


def test_async_query_and_async_stream(store):
    question = "How far did the glacier retreat?"
    expected = ask(question, store=store, model="tiny-llama", top_k=2, max_new_tokens=12).answer
    engine = CAGQueryEngine(CAGRetriever(store=store, similarity_top_k=2), model="tiny-llama", max_new_tokens=12)
    streaming = CAGQueryEngine(CAGRetriever(store=store, similarity_top_k=2), model="tiny-llama", max_new_tokens=12,
                               streaming=True)

    async def run():
        response = await engine.aquery(question)
        stream = await streaming.aquery(question)
        assert isinstance(stream, AsyncStreamingResponse)
        return response.response, [piece async for piece in stream.async_response_gen()]

    answer, pieces = asyncio.run(run())
    assert answer == expected and "".join(pieces) == expected


def test_node_postprocessors_choose_what_the_engine_answers_from(store):
    question = "How many cardamom buns does the bakery sell?"
    retriever = CAGRetriever(store=store, similarity_top_k=3)
    scores = [n.score for n in retriever.retrieve(question)]
    cutoff = (scores[0] + scores[1]) / 2
    engine = CAGQueryEngine(retriever, model="tiny-llama", max_new_tokens=12,
                            node_postprocessors=[SimilarityPostprocessor(similarity_cutoff=cutoff)])

    response = engine.query(question)

    top_1 = ask(question, store=store, model="tiny-llama", top_k=1, max_new_tokens=12).answer
    assert len(response.source_nodes) == 1 and response.response == top_1
    narrower = engine.with_retriever(CAGRetriever(store=store, similarity_top_k=1))
    assert narrower.query(question).response == top_1 and narrower.model == "tiny-llama"


def test_engine_placement_options_reach_the_answer(store):
    from cagkit.ask import Placement

    question = "How many cardamom buns does the bakery sell?"
    engine = CAGQueryEngine.from_store(store, similarity_top_k=3, model="tiny-llama", max_new_tokens=8,
                                       placement=Placement(blend=0.5), mode="mot", scope="chunks")
    blended = ask(question, store=store, model="tiny-llama", top_k=3, max_new_tokens=8, blend=0.5, mode="mot",
                  scope="chunks")
    plain = ask(question, store=store, model="tiny-llama", top_k=3, max_new_tokens=8, blend=0.0, mode="mot",
                scope="chunks")
    assert blended.answer != plain.answer  # so the engine's answer shows whether it blended
    assert engine.query(question).response == blended.answer
    narrower = engine.with_retriever(CAGRetriever(store=store, similarity_top_k=3))
    assert narrower.placement == Placement(blend=0.5)
    with pytest.raises(CagkitError, match="--blend"):
        CAGQueryEngine.from_store(store, model="tiny-llama", placement=Placement(blend=2.0))
    default = CAGQueryEngine.from_store(store, similarity_top_k=3, model="tiny-llama", max_new_tokens=8)
    response = default.query(question)
    assert default.placement is None and response.response == ask(
        question, store=store, model="tiny-llama", top_k=3, max_new_tokens=8).answer
    assert (response.metadata["mode"], response.metadata["scope"]) == ("select", "chunks")  # no stored KV read
    # mode auto: the store's own model reads its stored documents whole, as `cagkit ask --mode auto` does
    whole = CAGQueryEngine.from_store(store, similarity_top_k=3, model="tiny-llama", max_new_tokens=8,
                                      mode="auto").query(question)
    assert (whole.metadata["mode"], whole.metadata["scope"]) == ("reuse", "document") and whole.response == ask(
        question, store=store, model="tiny-llama", top_k=3, max_new_tokens=8, mode="auto").answer
    chunks = CAGQueryEngine.from_store(store, similarity_top_k=3, model="tiny-llama", max_new_tokens=8,
                                       mode="auto", scope="chunks").query(question)
    assert chunks.metadata["scope"] == "chunks" and chunks.response == ask(
        question, store=store, model="tiny-llama", top_k=3, max_new_tokens=8, mode="auto", scope="chunks").answer


def test_engine_refuses_nodes_that_are_not_from_a_store(store):
    engine = CAGQueryEngine.from_store(store, model="tiny-llama")
    foreign = [NodeWithScore(node=TextNode(text="from some other index"), score=1.0)]
    with pytest.raises(CagkitError, match="no cagkit chunk_id.*CAGRetriever"):
        engine.synthesize(QueryBundle("anything?"), foreign)


def test_reader_metadata_is_stored_and_unchanged_documents_are_skipped(tiny_llama, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "owls.md").write_text("# Owls\n\nThe barn owl of Kettering roosts in the old chapel tower.\n")
    (docs / "empty.txt").write_text("  \n")
    store = tmp_path / "store"
    options = dict(store=store, source="tiny-llama", chunk_tokens=32, progress=False)

    with pytest.warns(UserWarning, match="empty.txt.*no text"):
        first = ingest_documents(SimpleDirectoryReader(str(docs), filename_as_id=True), **options)
    owls = str(docs / "owls.md")
    assert first.added == [owls] and [p for p, _ in first.failed] == [str(docs / "empty.txt")]
    node = CAGRetriever(store=store, similarity_top_k=1).retrieve("Where does the barn owl roost?")[0].node
    assert node.metadata["file_name"] == "owls.md" and node.metadata["doc_path"] == owls

    with pytest.warns(UserWarning):
        again = ingest_documents(SimpleDirectoryReader(str(docs), filename_as_id=True), **options)
    assert again.unchanged == [owls] and not again.added and not again.updated

    retagged = [Document(id_=owls, text=(docs / "owls.md").read_text(), metadata={"species": "barn owl"})]
    assert ingest_documents(retagged, **options).updated == [owls]
    with Store.open(store) as st:
        assert st.search(embed(["barn owl"])[0], 1)[0].metadata == {"species": "barn owl"}


def test_bad_documents_are_clear_errors_before_any_prefill(tiny_llama, tmp_path):
    options = dict(store=tmp_path / "store", source="tiny-llama", chunk_tokens=32, progress=False)
    with pytest.raises(CagkitError, match="document id a appears twice"):
        ingest_documents([Document(id_="a", text="one"), Document(id_="a", text="two")], **options)
    with pytest.raises(CagkitError, match="metadata of document b cannot be stored"):
        ingest_documents([Document(id_="b", text="text", metadata={"when": object()})], **options)
    assert not (tmp_path / "store").exists()
    with pytest.raises(CagkitError, match="no cagkit store"):
        CAGRetriever(store=tmp_path / "nowhere")


def test_hit_metadata_is_json_in_the_manifest(store):
    import sqlite3

    with sqlite3.connect(store / "manifest.sqlite") as conn:
        raw = conn.execute("SELECT metadata FROM documents WHERE path = 'notes/bakery.txt'").fetchone()[0]
    assert json.loads(raw) == {"topic": "bakery", "pages": [1, 2], "reviewed": True}
