"""The engine of `cagkit serve`: the loaded models, the store, the queue of answers, cancellation and streaming.

    state = ServerState(config)            # the model pool, the store reader, ingest jobs, the counters
    job = state.submit(question, arrived)  # on the event loop: queue the answer on its model's thread
    piece = await job.next_piece()         # streamed text, None once the answer is finished
    answer, prompt, completion = job.done.result()
    job.abandon()                          # the client went away: off the queue, or stopped at the next token

Everything that touches a model (its tokenizer, retrieval for its question, the answer) runs on that model's
thread in the `ModelPool`; the event loop only moves bytes, so a slow answer never holds up another model's
requests, /health or /metrics. Nothing here knows HTTP: `cagkit.serve.app` turns requests into `Question`s
(`cagkit.serve.schemas`) and answers into response bodies.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cagkit.config import DEFAULT_SCOPE, Placement
from cagkit.errors import CagkitError
from cagkit.kv.warm import WarmCaches
from cagkit.serve.jobs import IngestJobs
from cagkit.serve.metrics import Metrics
from cagkit.serve.models import ModelPool
from cagkit.serve.settings import ServeConfig
from cagkit.serve.store import StoreReader

CHUNK_MARGIN_TOKENS = 8  # per retrieved chunk, room for the separators and sink tokens that placing it adds
DISCONNECT_POLL_S = 0.25  # how often a request still queued checks whether its client is still there


class ContextTooLong(CagkitError):
    """A question that, with the answer's tokens, does not fit in the model's context."""


class Cancelled(Exception):
    """Raised on a model's thread to stop an answer whose client went away."""


@dataclass
class Question:
    """What a completion request asks: the model, the question and how to answer it (made from a request's body by
    `cagkit.serve.schemas.parse_question`)."""

    kind: str  # "chat" or "text"
    model: str
    question: str
    stream: bool
    include_usage: bool
    max_new_tokens: int
    top_k: int
    mode: str
    retrieval: str
    placement: Placement
    documents: list[str] | None
    scope: str = DEFAULT_SCOPE
    blend_given: bool = True  # False: the blend is the scope's default (`cagkit.ask.default_blend`)


class ServerState:
    """The pool of models, the store, the ingest jobs and the counters of one server."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.contexts = WarmCaches(config.cache_bytes)  # placed documents kept for the next question on them
        # an unloaded model's warm contexts go with it: they hold its cache, and it may not be asked again soon
        self.pool = ModelPool(config.models, config.max_loaded, config.device,
                              on_unload=lambda lm: self.contexts.drop_model(lm.name))
        self.reader = StoreReader(config.store)
        self.jobs = IngestJobs(self.reader, config.device)
        self.metrics = Metrics()
        # The retrieval embedder is one model shared by every thread; its tokenizer is not safe to call from two
        # threads at once, and a query takes milliseconds, so retrievals take turns.
        self.embed_lock = threading.Lock()
        self.answering: set[Answering] = set()  # requests not finished yet, stopped when the server stops

    def warm(self) -> None:
        """Load the first --max-loaded models and the retrieval embedder, so that the first request waits for
        neither."""
        from cagkit.retrieval.embeddings import embed_query

        self.pool.preload()
        with self.embed_lock:
            embed_query("cagkit serve is starting")

    def close(self) -> None:
        for job in list(self.answering):
            job.cancel.set()
        self.jobs.close()
        self.pool.close()

    def submit(self, q: Question, arrived: float) -> Answering:
        """Queue the answer to `q` on its model's thread (called on the event loop); `arrived`: perf_counter
        seconds when the request came in."""
        job = Answering(self, q, asyncio.get_running_loop(), arrived)
        job.future = self.pool.submit(q.model, job.work)
        self.answering.add(job)
        job.future.add_done_callback(lambda _: self.answering.discard(job))
        job.done = asyncio.wrap_future(job.future)
        return job

    def retrieve(self, question: str, top_k: int, retrieval: str, documents: list[str] | None):
        """The store as this thread sees it (`StoreReader.current`), the hits for `question` from it, and the
        question's embedding (None when none of `documents` is stored), which the answer reuses."""
        from cagkit.retrieval.embeddings import embed_query
        from cagkit.retrieval.search import retrieve

        store = self.reader.current()
        if documents is not None:
            known = [d for d in documents if store.document(d) is not None]
            if not known:
                return store, [], None
            documents = known
        with self.embed_lock:
            vector = embed_query(question)
            return store, retrieve(store, question, top_k, retrieval, documents, vector), vector

    def warm_stats(self) -> dict:
        c = self.contexts
        return {"contexts": len(c), "bytes": c.nbytes, "hits": c.hits, "misses": c.misses}

    def store_stats(self) -> dict:
        try:
            store = self.reader.current()
            return {"documents": len(store.documents()), "chunks": store.num_chunks(),
                    "bytes": self.reader.disk_bytes()}
        except CagkitError:
            return {"documents": 0, "chunks": 0, "bytes": self.reader.disk_bytes()}


def fit(lm, hits, room: int, max_new_tokens: int) -> tuple[list, list[dict]]:
    """The best-ranked hits whose text fits in `room` target tokens, and the rest, dropped worst first, as the
    answer's `skipped` entries (reason `no_room`). A ContextTooLong, saying how much room there was, when not even
    the best hit fits: an answer from no context at all would not be an answer from the store."""
    kept, used = [], 0
    for hit in hits:  # best first
        need = lm.count_tokens(hit.text) + CHUNK_MARGIN_TOKENS
        if used + need > room:
            break
        kept.append(hit)
        used += need
    if hits and not kept:
        raise ContextTooLong(f"no retrieved chunk fits in {lm.name}'s context: the question and max_tokens "
                             f"{max_new_tokens} leave {room} tokens, and the best chunk ({hits[0].doc_path}, chunk "
                             f"{hits[0].idx}) needs {need}; lower max_tokens or shorten the question")
    dropped = [{"document": h.doc_path, "chunk": h.idx, "reason": "no_room",
                "error": f"left out: the {len(kept)} better chunks filled the {room} tokens that the question and "
                         f"max_tokens {max_new_tokens} leave in {lm.name}'s context"} for h in hits[len(kept):]]
    return kept, dropped


class Answering:
    """One completion request on its model's thread: its streamed pieces, the answer, and its cancellation.

    `future` is the work on the model's thread, `done` the same as an asyncio future on the event loop (both set
    by `ServerState.submit`); `done`'s result is (answer, prompt tokens, answer tokens)."""

    def __init__(self, state: ServerState, q: Question, loop: asyncio.AbstractEventLoop, arrived: float):
        self.state, self.q, self.loop, self.arrived = state, q, loop, arrived
        self.arrived_wall = time.time()
        self.pieces: asyncio.Queue[str] = asyncio.Queue()
        self.ready = asyncio.Event()  # set on the loop once the first piece is queued
        self.cancel = threading.Event()
        self.first_token_s: float | None = None
        self.window: list[float] = []
        self.future = None
        self.done: asyncio.Future | None = None
        self._started_text = False

    def work(self, lm):
        """Runs on the model's thread: retrieve, answer, count. Returns (answer, prompt tokens, answer tokens)."""
        from dataclasses import replace

        from cagkit.ask import answer_from_chunks, choose_scope, default_blend, resolve_mode
        from cagkit.generation import context_room, prompt_parts

        if self.cancel.is_set():
            raise Cancelled()
        self.window.append(time.time())
        try:
            q = self.q
            started = time.perf_counter()
            prefix, suffix = prompt = prompt_parts(lm, q.question)
            try:
                room = context_room(lm, prefix, suffix, q.max_new_tokens)
            except CagkitError as exc:
                raise ContextTooLong(str(exc)) from None
            store, hits, vector = self.state.retrieve(q.question, q.top_k, q.retrieval, q.documents)
            if q.documents is not None and not hits:
                raise CagkitError(f"none of the documents {', '.join(q.documents)[:300]} is in the store; name "
                                  f"stored documents (POST /v1/retrieve shows their ids) or leave 'documents' out")
            mode = resolve_mode(q.mode, lm, store)
            placed, scope, left_out = choose_scope(store, hits, q.scope, room, mode)
            dropped = []
            if scope == "chunks":
                placed, dropped = fit(lm, placed, room, q.max_new_tokens)
            retrieved = time.perf_counter()
            placement = q.placement if q.blend_given else replace(q.placement, blend=default_blend(mode, scope))
            answer = answer_from_chunks(lm, store, placed, q.question, mode, q.max_new_tokens, self._on_text,
                                        started=started, retrieved=retrieved, placement=placement, scope=scope,
                                        sources=[h for h in hits if scope == "document" or h in placed],
                                        prompt=prompt, vector=vector, warm=self.state.contexts)
            answer.retrieval = q.retrieval
            answer.skipped = left_out + dropped + answer.skipped
            completion = lm.count_tokens(answer.answer) if answer.answer else 0
            if self.first_token_s is None:
                self._first_token()
            return answer, len(prefix) + len(suffix) + answer.context_tokens, completion
        finally:
            self.window.append(time.time())

    def _first_token(self) -> None:
        self.first_token_s = time.perf_counter() - self.arrived
        self.state.metrics.first_token(self.q.model, self.first_token_s)

    def _on_text(self, piece: str) -> None:
        if self.cancel.is_set():
            raise Cancelled()
        if self.first_token_s is None:
            self._first_token()
        self.state.metrics.token(self.q.model)
        if self.q.stream:
            self.loop.call_soon_threadsafe(self._push, piece)

    def _push(self, piece: str) -> None:  # on the event loop
        self.pieces.put_nowait(piece)
        self.ready.set()

    # -- on the event loop --

    async def wait_first(self, is_disconnected: Callable[[], Awaitable[bool]]) -> None:
        """Wait until the answer has its first piece or is finished, raising Cancelled if the client goes away
        first (`is_disconnected`: the request's check)."""
        ready = asyncio.ensure_future(self.ready.wait())
        done = self.done
        try:
            while not done.done() and not ready.done():
                await asyncio.wait({ready, done}, timeout=DISCONNECT_POLL_S, return_when=asyncio.FIRST_COMPLETED)
                if not done.done() and not ready.done() and await is_disconnected():
                    raise Cancelled()
        finally:
            ready.cancel()

    async def wait_done(self, is_disconnected: Callable[[], Awaitable[bool]]) -> None:
        """Wait for the rest of the answer, raising Cancelled if the client goes away first."""
        while not self.done.done():
            await asyncio.wait({self.done}, timeout=DISCONNECT_POLL_S)
            if not self.done.done() and await is_disconnected():
                raise Cancelled()

    async def next_piece(self) -> str | None:
        """The next piece of a streamed answer's text, or None once the answer is finished. The answer is
        stripped; so is the start of the stream."""
        while True:
            if self.pieces.empty():
                if self.done.done():
                    return None
                getter = asyncio.ensure_future(self.pieces.get())
                try:
                    finished, _ = await asyncio.wait({getter, self.done}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not getter.done():
                        getter.cancel()
                if getter not in finished:
                    continue
                piece = getter.result()
            else:
                piece = self.pieces.get_nowait()
            if not self._started_text:
                piece = piece.lstrip()
                if not piece:
                    continue
                self._started_text = True
            return piece

    def queued_ms(self) -> float:
        """Milliseconds the request waited for its model's thread (and for the model to load)."""
        return max((self.window[0] - self.arrived_wall) * 1e3, 0.0) if self.window else 0.0

    def abandon(self) -> None:
        """The client is gone: take the request off its model's queue, or stop its answer at the next token."""
        self.cancel.set()
        if self.future.cancel() or not self.future.done():
            self.state.metrics.cancelled(self.q.model)
        self.done.add_done_callback(_consume)


def _consume(done: asyncio.Future) -> None:
    """Read an abandoned answer's outcome, so that asyncio does not log it as never retrieved."""
    if not done.cancelled():
        done.exception()
