"""LlamaIndex integration: build a store from LlamaIndex Documents, retrieve its chunks as nodes, answer from their KV.

    from llama_index.core import SimpleDirectoryReader
    from cagkit.integrations.llama_index import CAGQueryEngine, CAGRetriever, ingest_documents

    ingest_documents(SimpleDirectoryReader("docs", filename_as_id=True), store="stores/docs")
    retriever = CAGRetriever(store="stores/docs", similarity_top_k=4)
    engine = CAGQueryEngine(retriever, model="gemma", streaming=True)
    engine.query("What does the store keep?").print_response_stream()

A retrieved node's text is the chunk's text; its metadata is its Document's metadata plus `doc_path` (the document's
id in the store), `chunk_id` and `chunk_index`. The query engine loads each node's stored KV by `chunk_id`, so it
answers from nodes of a cagkit store, whichever retriever or postprocessors brought them.

These classes wrap the functions behind the CLI (`cagkit.ask.retrieve`, `cagkit.ask.answer_from_chunks`,
`cagkit.ingest.ingest_texts`): a query engine and `cagkit.ask` with the same settings give the same answer.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncGenerator, Generator, Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from llama_index.core.base.base_query_engine import BaseQueryEngine
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.response.schema import RESPONSE_TYPE, AsyncStreamingResponse, Response, StreamingResponse
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.callbacks.schema import CBEventType, EventPayload
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.readers.base import BaseReader
from llama_index.core.schema import (
    Document,
    MetadataMode,
    NodeRelationship,
    NodeWithScore,
    QueryBundle,
    RelatedNodeInfo,
    TextNode,
)
from llama_index.core.settings import Settings

from cagkit.ask import (
    MODES,
    Answer,
    Placement,
    answer_from_chunks,
    check_scope,
    choose_scope,
    default_blend,
    resolve_mode,
)
from cagkit.config import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODE,
    DEFAULT_MODEL,
    DEFAULT_RETRIEVAL,
    DEFAULT_SCOPE,
    DEFAULT_STORE,
    DEFAULT_TOP_K,
)
from cagkit.errors import CagkitError
from cagkit.generation import context_room, prompt_parts
from cagkit.ingest.pipeline import IngestReport, ingest_texts
from cagkit.kv.context import SelectedSentences
from cagkit.models.loading import load_model
from cagkit.retrieval.rank import check_retrieval
from cagkit.retrieval.search import retrieve
from cagkit.store.store import Hit, Store

# Metadata keys that locate a node's chunk in the store; not for embedding or for an LLM's prompt.
_CHUNK_KEYS = ("chunk_id", "chunk_index")


def ingest_documents(
    documents: Iterable[Document] | BaseReader, store: str | Path = DEFAULT_STORE, **options
) -> IngestReport:
    """Add LlamaIndex Documents (or everything a reader such as SimpleDirectoryReader loads) to a cagkit store.

    Args:
        documents: Documents, or a reader whose `load_data()` gives them.
        store: the store directory; created on first use.
        options: as for `cagkit.ingest`: source, chunk_tokens, prune, dtype, progress.

    Each Document is stored under its `doc_id` with its metadata, which comes back on every retrieved node of it.
    Unchanged Documents are skipped on a later run only if their ids are stable: give SimpleDirectoryReader
    `filename_as_id=True`, or set `id_` yourself.
    """
    if isinstance(documents, BaseReader):
        documents = documents.load_data()
    return ingest_texts([(d.doc_id, d.text, d.metadata) for d in documents], store=store, **options)


class CAGRetriever(BaseRetriever):
    """The `similarity_top_k` chunks of a cagkit store best for the query, as LlamaIndex nodes, best first.

    `retrieval` ranks them as `cagkit ask --retrieval` does: `hybrid` (default: the embedding's and BM25's
    rankings fused), `dense` or `lexical`; each node's score is the one it was ranked by (cosine similarity,
    BM25, or the fused reciprocal-rank score, 1 for first in both rankings)."""

    def __init__(
        self,
        store: str | Path | Store = DEFAULT_STORE,
        similarity_top_k: int = DEFAULT_TOP_K,
        retrieval: str = DEFAULT_RETRIEVAL,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if similarity_top_k < 1:
            raise CagkitError(f"similarity_top_k must be at least 1, got {similarity_top_k}")
        check_retrieval(retrieval)
        self.retrieval = retrieval
        self.store_path = store if isinstance(store, (str, Path)) else store.path  # a folder or a URL
        self.similarity_top_k = similarity_top_k
        self._local = threading.local()
        self._store()  # a missing store fails here, not at the first query
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _store(self) -> Store:
        # An sqlite3 connection serves only the thread that opened it, so each thread opens the store once.
        if getattr(self._local, "store", None) is None:
            self._local.store = Store.open(self.store_path)
        return self._local.store

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = retrieve(self._store(), query_bundle.query_str, self.similarity_top_k, self.retrieval)
        return [NodeWithScore(node=_node(hit), score=hit.score) for hit in hits]


class CAGQueryEngine(BaseQueryEngine):
    """Answers with `model` from the retrieved chunks or their documents: `cagkit.ask` as a LlamaIndex query
    engine. By default (`select`) the model prefills the chunks' sentences closest to the question; `mode="stored"`
    answers from the stored KV (whole documents where they fit: for the store's own model, native prefill's
    cache; translated for another model), and `mode="auto"` picks `stored` where the store holds the model's own
    KV and `select` elsewhere.

    Args:
        retriever: gives the nodes; any retriever whose nodes come from the cagkit store (a CAGRetriever, or one
            that combines CAGRetrievers).
        model: the target model (alias, Hugging Face id or model directory).
        mode: where the target's context comes from: `select` (the default), `stored` (`mot`), `auto`, `linear`,
            `projector`, `native` or `oracle`, as for `cagkit.ask`.
        max_new_tokens: the longest answer, in tokens.
        streaming: `query` returns a StreamingResponse whose `response_gen` yields the answer as it is generated
            (`aquery`: an AsyncStreamingResponse).
        node_postprocessors: applied to the retrieved nodes before answering, as in RetrieverQueryEngine.
        store: the store the nodes come from; needed only when the retriever is not a CAGRetriever.
        callback_manager: LlamaIndex callbacks (default: `Settings.callback_manager`).
        placement: ask-time speed/quality options (`cagkit.ask.Placement`: `recompute_layers`, `blend`,
            `blend_select`); None: `cagkit.ask`'s defaults, which place whole documents as stored (blend 0).
        device: where the model runs: `auto` (default, or `$CAGKIT_DEVICE`), `cpu`, `cuda` or `cuda:N`.
        scope: `auto` (the default), `document` or `chunks`, as `cagkit ask --scope` (`cagkit.ask.choose_scope`):
            whether the retrieved nodes' documents are placed whole.

    The prompt around the chunks is cagkit's (`cagkit.generation.prompt_parts`), not a LlamaIndex template, because
    the chunks enter the model as KV rather than as prompt text. Response metadata holds the model, the mode, the
    context size in tokens and the timings of `cagkit.Answer`.
    """

    def __init__(
        self,
        retriever: BaseRetriever,
        model: str = DEFAULT_MODEL,
        mode: str = DEFAULT_MODE,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        streaming: bool = False,
        node_postprocessors: list[BaseNodePostprocessor] | None = None,
        store: str | Path | Store | None = None,
        callback_manager: CallbackManager | None = None,
        placement: Placement | None = None,
        device: str | None = None,
        scope: str = DEFAULT_SCOPE,
    ) -> None:
        if mode not in MODES:
            raise CagkitError(f"unknown mode '{mode}'; use one of {', '.join(MODES)}")
        check_scope(scope)
        self.scope = scope
        store = store if store is not None else getattr(retriever, "store_path", None)
        if store is None:
            raise CagkitError(
                "CAGQueryEngine needs the cagkit store its retriever's nodes come from: pass store=PATH "
                "(a CAGRetriever tells it by itself)"
            )
        self.store_path = store if isinstance(store, (str, Path)) else store.path  # a folder or a URL
        self.model = model
        self.lm = load_model(model, device)
        self.mode = mode
        self.placement = placement  # None: the scope's default blend
        (placement or Placement()).check(self.lm)
        if mode == "select":
            SelectedSentences.check(placement or Placement())
        self.max_new_tokens = max_new_tokens
        self.streaming = streaming
        self._retriever = retriever
        self._node_postprocessors = node_postprocessors or []
        callback_manager = callback_manager or Settings.callback_manager
        for postprocessor in self._node_postprocessors:
            postprocessor.callback_manager = callback_manager
        super().__init__(callback_manager=callback_manager)

    @classmethod
    def from_store(
        cls, store: str | Path | Store = DEFAULT_STORE, similarity_top_k: int = DEFAULT_TOP_K, **kwargs
    ) -> CAGQueryEngine:
        """A query engine over a CAGRetriever of `store`; `kwargs` as for CAGQueryEngine."""
        return cls(CAGRetriever(store, similarity_top_k), **kwargs)

    @property
    def retriever(self) -> BaseRetriever:
        return self._retriever

    def with_retriever(self, retriever: BaseRetriever) -> CAGQueryEngine:
        """The same engine (model, settings, postprocessors) over another retriever."""
        return CAGQueryEngine(
            retriever, self.model, self.mode, self.max_new_tokens, self.streaming, self._node_postprocessors,
            getattr(retriever, "store_path", self.store_path), self.callback_manager, self.placement,
            scope=self.scope,
        )

    def _get_prompt_modules(self) -> dict:
        return {}

    # -- retrieval --------------------------------------------------------------------------------------

    def retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        nodes = self._retriever.retrieve(query_bundle)
        for postprocessor in self._node_postprocessors:
            nodes = postprocessor.postprocess_nodes(nodes, query_bundle=query_bundle)
        return nodes

    async def aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        nodes = await self._retriever.aretrieve(query_bundle)
        for postprocessor in self._node_postprocessors:
            nodes = await postprocessor.apostprocess_nodes(nodes, query_bundle=query_bundle)
        return nodes

    # -- answering --------------------------------------------------------------------------------------

    def synthesize(
        self,
        query_bundle: QueryBundle,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
    ) -> RESPONSE_TYPE:
        """Answer from the KV of `nodes` (nodes of the cagkit store); `additional_source_nodes` are only listed."""
        return self._respond(query_bundle, nodes, additional_source_nodes)

    async def asynthesize(
        self,
        query_bundle: QueryBundle,
        nodes: list[NodeWithScore],
        additional_source_nodes: Sequence[NodeWithScore] | None = None,
    ) -> RESPONSE_TYPE:
        return await self._arespond(query_bundle, nodes, additional_source_nodes)

    def _query(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        with self.callback_manager.event(
            CBEventType.QUERY, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as query_event:
            started = time.perf_counter()
            nodes = self.retrieve(query_bundle)
            response = self._respond(query_bundle, nodes, None, started, time.perf_counter())
            query_event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    async def _aquery(self, query_bundle: QueryBundle) -> RESPONSE_TYPE:
        with self.callback_manager.event(
            CBEventType.QUERY, payload={EventPayload.QUERY_STR: query_bundle.query_str}
        ) as query_event:
            started = time.perf_counter()
            nodes = await self.aretrieve(query_bundle)
            response = await self._arespond(query_bundle, nodes, None, started, time.perf_counter())
            query_event.on_end(payload={EventPayload.RESPONSE: response})
        return response

    def _respond(self, query_bundle, nodes, additional_source_nodes, started=None, retrieved=None) -> RESPONSE_TYPE:
        hits = [_hit(n) for n in nodes]
        sources = list(nodes) + list(additional_source_nodes or [])
        if not self.streaming:
            answer = self._answer(hits, query_bundle.query_str, None, started, retrieved)
            return Response(answer.answer, sources, _response_metadata(answer))
        metadata: dict = {}  # filled in when the answer is complete
        stream = self._stream(hits, query_bundle.query_str, metadata, started, retrieved)
        return StreamingResponse(stream, sources, metadata)

    async def _arespond(self, query_bundle, nodes, additional_source_nodes, started=None, retrieved=None):
        # Generation blocks for seconds; a worker thread keeps the event loop free.
        response = await asyncio.to_thread(
            self._respond, query_bundle, nodes, additional_source_nodes, started, retrieved
        )
        if isinstance(response, StreamingResponse):
            return AsyncStreamingResponse(_aiterate(response.response_gen), response.source_nodes, response.metadata)
        return response

    def _answer(self, hits: list[Hit], question: str, on_text, started, retrieved) -> Answer:
        # Opened here, in the thread that generates, for the same sqlite3 reason as in CAGRetriever.
        with Store.open(self.store_path) as store:
            mode = resolve_mode(self.mode, self.lm, store)
            prompt = prompt_parts(self.lm, question)
            room = context_room(self.lm, *prompt, self.max_new_tokens)
            placed, scope, left_out = choose_scope(store, hits, self.scope, room, mode)
            placement = self.placement or replace(Placement(), blend=default_blend(mode, scope))
            answer = answer_from_chunks(
                self.lm, store, placed, question, mode, self.max_new_tokens, on_text, started, retrieved,
                placement=placement, scope=scope, sources=hits, prompt=prompt,
            )
            answer.skipped = left_out + answer.skipped
            return answer

    def _stream(self, hits, question, metadata, started, retrieved) -> Generator[str, None, None]:
        """Yield the answer as a worker thread generates it; the pieces join to exactly `Answer.answer`.

        Generation reports pieces through a callback, hence the thread and the queue. The answer is stripped of
        surrounding whitespace, so whitespace is held back until text follows it, and whatever the pieces missed
        at the end (a base model's answer is cut at its first line) is yielded last.
        """
        pieces: queue.Queue = queue.Queue()

        def work() -> None:
            try:
                pieces.put(self._answer(hits, question, pieces.put, started, retrieved))
            except BaseException as exc:  # re-raised in the consumer's thread
                pieces.put(exc)

        threading.Thread(target=work, name="cagkit-answer", daemon=True).start()
        shown = held = ""
        while isinstance(piece := pieces.get(), str):
            text = held + piece if shown else (held + piece).lstrip()
            visible = text.rstrip()
            held = text[len(visible):]
            if visible:
                shown += visible
                yield visible
        if isinstance(piece, BaseException):
            raise piece
        metadata.update(_response_metadata(piece))
        if piece.answer.startswith(shown) and len(piece.answer) > len(shown):
            yield piece.answer[len(shown):]


async def _aiterate(gen: Generator[str, None, None]) -> AsyncGenerator[str, None]:
    """An async view of a blocking generator: each step runs in a worker thread."""
    end = object()
    while (piece := await asyncio.to_thread(next, gen, end)) is not end:
        yield piece


def _node(hit: Hit) -> TextNode:
    return TextNode(
        id_=f"{hit.doc_path}#{hit.idx}",
        text=hit.text,
        metadata={**hit.metadata, "doc_path": hit.doc_path, "chunk_id": hit.chunk_id, "chunk_index": hit.idx},
        excluded_embed_metadata_keys=list(_CHUNK_KEYS),
        excluded_llm_metadata_keys=list(_CHUNK_KEYS),
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=hit.doc_path)},
    )


def _hit(scored: NodeWithScore) -> Hit:
    meta = scored.node.metadata
    if "chunk_id" not in meta:
        raise CagkitError(
            f"node {scored.node.node_id} has no cagkit chunk_id; CAGQueryEngine answers from stored KV caches, so its "
            f"retriever must return nodes of a cagkit store (use CAGRetriever)"
        )
    return Hit(
        int(meta["chunk_id"]), meta["doc_path"], int(meta["chunk_index"]),
        scored.node.get_content(metadata_mode=MetadataMode.NONE), scored.score or 0.0,
    )


def _response_metadata(answer: Answer) -> dict:
    return {"model": answer.model, "mode": answer.mode, "context_tokens": answer.context_tokens,
            "scope": answer.scope, "documents": answer.documents, "timings": answer.timings}
