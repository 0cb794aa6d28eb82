"""The FastAPI app of `cagkit serve`: OpenAI-style completions over the store, retrieval, ingest, health, metrics.

    create_app(ServeConfig(store="stores/default", models=("smollm2",)))  # an ASGI app, for any ASGI server
    serve(config)                                                         # what `cagkit serve` runs (uvicorn)

Request bodies are parsed here, by hand, so that every bad input gets the OpenAI error body
(`{"error": {"message", "type", "param", "code"}}`) with a 4xx status rather than FastAPI's own 422 layout.
Everything that touches a model (its tokenizer, retrieval for its question, the answer) runs on that model's
thread in the `ModelPool`; the event loop only moves bytes, so a slow answer never holds up another model's
requests, /health or /metrics.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cagkit.config import (
    ASK_MODES,
    BLEND_SELECT,
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODE,
    DEFAULT_RETRIEVAL,
    DEFAULT_SCOPE,
    DEFAULT_TOP_K,
    RETRIEVAL_MODES,
    SCOPES,
    Placement,
)
from cagkit.errors import CagkitError, ModelError, StoreError, TranslatorError
from cagkit.serve.jobs import IngestJobs
from cagkit.serve.metrics import Metrics
from cagkit.serve.models import ModelPool
from cagkit.serve.settings import ServeConfig
from cagkit.serve.store import StoreMissing, StoreReader

log = logging.getLogger("cagkit.serve")

MAX_TOP_K = 64  # chunks one request may retrieve: more would only fill the model's context
MAX_NEW_TOKENS = 8192  # the most answer tokens one request may ask for (the model's context bounds it further)
MAX_INGEST_DOCUMENTS = 1000  # documents one POST /v1/ingest may carry
# The longest question or query read, checked before it waits for a model or the embedder: about 250k tokens of
# ordinary text, far past the shipped models' contexts (at most 32k tokens); what is shorter but still too long for
# its model is refused once tokenised, on the model's thread (a second for a million characters).
MAX_QUESTION_CHARS = 1_000_000
CHUNK_MARGIN_TOKENS = 8  # per retrieved chunk, room for the separators and sink tokens that placing it adds
SHUTDOWN_GRACE_S = 3  # seconds the answers in progress get to finish when the server is stopped
DISCONNECT_POLL_S = 0.25  # how often a request still queued checks whether its client is still there


class ApiError(Exception):
    """A request the server refuses, as OpenAI's error body and an HTTP status."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.kind, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


class ContextTooLong(CagkitError):
    """A question that, with the answer's tokens, does not fit in the model's context."""


class _Cancelled(Exception):
    """Raised on a model's thread to stop an answer whose client went away."""


def api_error(exc: CagkitError) -> ApiError:
    """The HTTP error for a problem the library reported."""
    if isinstance(exc, StoreMissing):
        return ApiError(404, str(exc), "store_not_found")
    if isinstance(exc, ContextTooLong):
        return ApiError(400, str(exc), "context_length_exceeded", "messages")
    if isinstance(exc, ModelError):
        return ApiError(400, str(exc), "model_error", "model")
    if isinstance(exc, TranslatorError):
        return ApiError(400, str(exc), "translator_not_found", "mode")
    if isinstance(exc, StoreError):
        return ApiError(409, str(exc), "store_error")
    return ApiError(400, str(exc), "invalid_request")


# -- request bodies ----------------------------------------------------------------------------------------------


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    if not raw.strip():
        raise ApiError(400, "the request has no body; send a JSON object", "invalid_json")
    try:
        body = json.loads(raw)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text; send a JSON object", "invalid_json") from None
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno} column "
                            f"{exc.colno}); send a JSON object", "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body is a JSON {type(body).__name__}; send a JSON object", "invalid_json")
    return body


def _int(body: dict, name: str, default: int, lo: int, hi: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ApiError(400, f"'{name}' must be a whole number from {lo} to {hi}, got {json.dumps(value)}",
                       "invalid_value", name)
    return value


def _float(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"'{name}' must be a number, got {json.dumps(value)}", "invalid_value", name)
    return float(value)


def _choice(body: dict, name: str, default: str, choices: tuple[str, ...]) -> str:
    value = body.get(name)
    if value is None:
        return default
    if value not in choices:
        raise ApiError(400, f"'{name}' must be one of {', '.join(choices)}, got {json.dumps(value)}",
                       "invalid_value", name)
    return value


def _strings(body: dict, name: str) -> list[str] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ApiError(400, f"'{name}' must be a non-empty list of strings, got {json.dumps(value)[:200]}",
                       "invalid_value", name)
    return value


def _text_of(content, where: str) -> str:
    """A message's text: a string, or OpenAI's list of content parts (only text parts are read)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)
    raise ApiError(400, f"{where} content must be a string or a list of text parts", "invalid_value", "messages")


def _check_length(text: str, what: str, param: str) -> None:
    """Refuse a question or query past `MAX_QUESTION_CHARS` before it queues: tokenising it on the model's thread
    would hold up every request behind it, only to refuse it there."""
    if len(text) > MAX_QUESTION_CHARS:
        raise ApiError(400, f"the {what} is {len(text):,} characters, over the {MAX_QUESTION_CHARS:,} this server "
                            f"reads; shorten it to what the model's context holds", "context_length_exceeded", param)


@dataclass
class Question:
    """What a completion request asks: the model, the question and how to answer it."""

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


def parse_question(body: dict, kind: str, served: tuple[str, ...]) -> Question:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, f"'model' is missing; name one of the served models: {', '.join(served)}",
                       "invalid_value", "model")
    if model not in served:
        raise ApiError(404, f"the model '{model}' is not served here; use one of {', '.join(served)} (GET "
                            f"/v1/models lists them)", "model_not_found", "model")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list of {role, content} objects ending with the "
                                "question as a user message", "invalid_value", "messages")
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if not users:
            raise ApiError(400, "'messages' has no message with role 'user'; the last user message is the question",
                           "invalid_value", "messages")
        question = _text_of(users[-1].get("content"), "the last user message's")
        param = "messages"
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' must be one string: the question", "invalid_value", "prompt")
        question, param = prompt, "prompt"
    if not question.strip():
        raise ApiError(400, f"the question is empty; put it in '{param}'", "invalid_value", param)
    _check_length(question, "question", param)
    n = _int(body, "n", 1, 1, 1)
    del n  # one answer per request: greedy decoding would give the same one again
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"'stream' must be true or false, got {json.dumps(stream)}", "invalid_value", "stream")
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    tokens_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_new = _int(body, tokens_field, DEFAULT_MAX_NEW_TOKENS, 1, MAX_NEW_TOKENS)
    blend_given = body.get("blend") is not None
    blend = _float(body, "blend", Placement.blend)
    if not 0.0 <= blend <= 1.0:
        raise ApiError(400, f"'blend' must be a share of the context tokens from 0 to 1, got {blend:g}",
                       "invalid_value", "blend")
    placement = Placement(_int(body, "recompute_layers", Placement.recompute_layers, 0, 1024), blend,
                          _choice(body, "blend_select", Placement.blend_select, BLEND_SELECT))
    return Question(kind, model, question, stream, include_usage, max_new,
                    _int(body, "top_k", DEFAULT_TOP_K, 1, MAX_TOP_K),
                    _choice(body, "mode", DEFAULT_MODE, ASK_MODES), _choice(body, "retrieval", DEFAULT_RETRIEVAL,
                                                                     RETRIEVAL_MODES),
                    placement, _strings(body, "documents"), _choice(body, "scope", DEFAULT_SCOPE, SCOPES),
                    blend_given)


# -- the server's state ------------------------------------------------------------------------------------------


class ServerState:
    """The pool of models, the store, the ingest jobs and the counters of one server."""

    def __init__(self, config: ServeConfig):
        self.config = config
        self.pool = ModelPool(config.models, config.max_loaded, config.device)
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

    def retrieve(self, question: str, top_k: int, retrieval: str, documents: list[str] | None):
        """The hits for `question` from the store as this thread sees it (`StoreReader.current`)."""
        from cagkit.retrieval.search import retrieve

        store = self.reader.current()
        if documents is not None:
            known = [d for d in documents if store.document(d) is not None]
            if not known:
                return store, []
            documents = known
        with self.embed_lock:
            return store, retrieve(store, question, top_k, retrieval, documents)

    def store_stats(self) -> dict:
        try:
            store = self.reader.current()
            return {"documents": len(store.documents()), "chunks": store.num_chunks(),
                    "bytes": self.reader.disk_bytes()}
        except CagkitError:
            return {"documents": 0, "chunks": 0, "bytes": self.reader.disk_bytes()}


def _fit(lm, hits, room: int, max_new_tokens: int) -> tuple[list, list[dict]]:
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
    """One completion request on its model's thread: its streamed pieces, the answer, and its cancellation."""

    def __init__(self, state: ServerState, q: Question, loop: asyncio.AbstractEventLoop, arrived: float):
        self.state, self.q, self.loop, self.arrived = state, q, loop, arrived
        self.arrived_wall = time.time()
        self.pieces: asyncio.Queue[str] = asyncio.Queue()
        self.ready = asyncio.Event()  # set on the loop once the first piece is queued
        self.cancel = threading.Event()
        self.first_token_s: float | None = None
        self.window: list[float] = []

    def work(self, lm):
        """Runs on the model's thread: retrieve, answer, count. Returns (answer, prompt tokens, answer tokens)."""
        from dataclasses import replace

        from cagkit.ask import answer_from_chunks, choose_scope, default_blend, resolve_mode
        from cagkit.generation import context_room, prompt_parts

        if self.cancel.is_set():
            raise _Cancelled()
        self.window.append(time.time())
        try:
            q = self.q
            started = time.perf_counter()
            prefix, suffix = prompt_parts(lm, q.question)
            try:
                room = context_room(lm, prefix, suffix, q.max_new_tokens)
            except CagkitError as exc:
                raise ContextTooLong(str(exc)) from None
            store, hits = self.state.retrieve(q.question, q.top_k, q.retrieval, q.documents)
            if q.documents is not None and not hits:
                raise CagkitError(f"none of the documents {', '.join(q.documents)[:300]} is in the store; name "
                                  f"stored documents (POST /v1/retrieve shows their ids) or leave 'documents' out")
            mode = resolve_mode(q.mode, lm, store)
            placed, scope, left_out = choose_scope(store, hits, q.scope, room, mode)
            dropped = []
            if scope == "chunks":
                placed, dropped = _fit(lm, placed, room, q.max_new_tokens)
            retrieved = time.perf_counter()
            placement = q.placement if q.blend_given else replace(q.placement, blend=default_blend(mode, scope))
            answer = answer_from_chunks(lm, store, placed, q.question, mode, q.max_new_tokens, self._on_text,
                                        started=started, retrieved=retrieved, placement=placement, scope=scope,
                                        sources=[h for h in hits if scope == "document" or h in placed])
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
            raise _Cancelled()
        if self.first_token_s is None:
            self._first_token()
        self.state.metrics.token(self.q.model)
        if self.q.stream:
            self.loop.call_soon_threadsafe(self._push, piece)

    def _push(self, piece: str) -> None:  # on the event loop
        self.pieces.put_nowait(piece)
        self.ready.set()


async def _wait_first(request: Request, job: Answering, done: asyncio.Future) -> None:
    """Wait until the answer has its first piece or is finished, cancelling it if the client goes away first."""
    ready = asyncio.ensure_future(job.ready.wait())
    try:
        while not done.done() and not ready.done():
            await asyncio.wait({ready, done}, timeout=DISCONNECT_POLL_S, return_when=asyncio.FIRST_COMPLETED)
            if not done.done() and not ready.done() and await request.is_disconnected():
                raise _Cancelled()
    finally:
        ready.cancel()


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _cagkit_part(answer, job: Answering, queued_ms: float) -> dict:
    timings = dict(answer.timings, queue_ms=queued_ms)
    return {"sources": answer.sources, "timings": timings, "mode": answer.mode, "retrieval": answer.retrieval,
            "context_tokens": answer.context_tokens, "placement": answer.placement,
            "scope": answer.scope, "documents": answer.documents,
            # retrieved chunks left out because their stored KV is damaged (where cagkit.ask reports them)
            "skipped": answer.skipped,
            "served": {"start": job.window[0], "end": job.window[-1]} if job.window else None}


# -- the app -----------------------------------------------------------------------------------------------------


class _Gate:
    """ASGI middleware: the bearer key on /v1 (when the server has one) and the request counters.

    Plain ASGI rather than `@app.middleware`, which wraps streamed bodies in a way that hides a client's
    disconnect from the stream."""

    def __init__(self, app, state: ServerState):
        self.app, self.state = app, state
        key = state.config.api_key
        self.expected = key.encode() if key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def sending(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if self.expected is not None and scope["path"].startswith("/v1"):
                # the scheme is case-insensitive (RFC 7235): `bearer KEY` is as good as `Bearer KEY`
                scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
                if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                    response = ApiError(401, "missing or wrong API key; send the header 'Authorization: Bearer "
                                             "<key>' with the key the server was started with (--api-key)",
                                        "invalid_api_key", kind="authentication_error").response()
                    await response(scope, receive, sending)
                    return
            await self.app(scope, receive, sending)
        finally:
            route = scope.get("route")
            self.state.metrics.request(scope.get("method", "?"), getattr(route, "path", "unmatched"), status)


def create_app(config: ServeConfig) -> FastAPI:
    """The ASGI app serving `config`'s models over its store; models load when the app starts (its lifespan)."""
    config.check()
    state = ServerState(config)

    @asynccontextmanager
    async def lifespan(app):
        await asyncio.to_thread(state.warm)
        log.info("cagkit serve is ready on http://%s:%d (models loaded: %s)", config.host, config.port,
                 ", ".join(state.pool.loaded()))
        try:
            yield
        finally:
            state.close()

    app = FastAPI(title="cagkit serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.cagkit = state
    app.add_middleware(_Gate, state=state)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, exc: StarletteHTTPException):
        code = "not_found" if exc.status_code == 404 else "method_not_allowed" if exc.status_code == 405 else None
        return ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}; the API is "
                                         f"described in docs/serve.md", code).response()

    @app.exception_handler(Exception)
    async def _internal(request, exc: Exception):
        log.exception("internal error on %s %s", request.method, request.url.path)
        return ApiError(500, f"internal error ({type(exc).__name__}); see the server's log", "internal_error",
                        kind="server_error").response()

    async def complete(request: Request, kind: str):
        arrived = time.perf_counter()
        q = parse_question(await _json_body(request), kind, config.models)
        job = Answering(state, q, asyncio.get_running_loop(), arrived)
        future = state.pool.submit(q.model, job.work)
        state.answering.add(job)
        future.add_done_callback(lambda _: state.answering.discard(job))
        done = asyncio.wrap_future(future)
        finished = False
        try:
            await _wait_first(request, job, done)
            if done.done() and done.exception() is not None:
                exc = done.exception()
                if isinstance(exc, CagkitError):
                    raise api_error(exc)
                raise exc
            created, rid = int(time.time()), f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
            if not q.stream:
                while not done.done():  # the rest of the answer, watching for the client to leave
                    await asyncio.wait({done}, timeout=DISCONNECT_POLL_S)
                    if not done.done() and await request.is_disconnected():
                        raise _Cancelled()
                body = _final_body(job, done, kind, rid, created, arrived)
                finished = True
                return JSONResponse(body)
            finished = True  # the stream owns the answer from here
            return StreamingResponse(_events(job, done, future, kind, rid, created, arrived),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        except _Cancelled:
            return Response(status_code=499)  # nobody reads it; the counters show the request as cancelled
        finally:
            if not finished:
                _abandon(state, job, future, done)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, "text")

    @app.post("/v1/retrieve")
    async def retrieve(request: Request):
        body = await _json_body(request)
        query = body.get("query", body.get("question"))
        if not isinstance(query, str) or not query.strip():
            raise ApiError(400, "'query' must be a non-empty string: the question to retrieve chunks for",
                           "invalid_value", "query")
        _check_length(query, "query", "query")
        top_k = _int(body, "top_k", DEFAULT_TOP_K, 1, 1000)
        retrieval = _choice(body, "retrieval", DEFAULT_RETRIEVAL, RETRIEVAL_MODES)
        documents = _strings(body, "documents")
        started = time.perf_counter()
        try:
            _, hits = await asyncio.to_thread(state.retrieve, query, top_k, retrieval, documents)
        except CagkitError as exc:
            raise api_error(exc) from None
        return {"object": "list", "retrieval": retrieval,
                "data": [{"document": h.doc_path, "chunk": h.idx, "chunk_id": h.chunk_id, "score": round(h.score, 4),
                          "text": h.text, "metadata": h.metadata} for h in hits],
                "timings": {"retrieve_ms": (time.perf_counter() - started) * 1e3}}

    @app.post("/v1/ingest", status_code=202)
    async def ingest(request: Request):
        body = await _json_body(request)
        todo: list = []
        texts = body.get("texts")
        if texts is not None:
            if not isinstance(texts, list):
                raise ApiError(400, "'texts' must be a list of strings or {id, text, metadata} objects",
                               "invalid_value", "texts")
            for i, item in enumerate(texts):
                if isinstance(item, str):
                    item = {"text": item}
                if not isinstance(item, dict) or not isinstance(item.get("text"), str):
                    raise ApiError(400, f"texts[{i}] must be a string or an object with a 'text' string",
                                   "invalid_value", "texts")
                metadata = item.get("metadata")
                if metadata is not None and not isinstance(metadata, dict):
                    raise ApiError(400, f"texts[{i}].metadata must be an object", "invalid_value", "texts")
                doc_id = item.get("id")
                if doc_id is None:
                    doc_id = f"text-{uuid.uuid5(uuid.NAMESPACE_OID, item['text']).hex[:16]}"
                if not isinstance(doc_id, str) or not doc_id:
                    raise ApiError(400, f"texts[{i}].id must be a non-empty string", "invalid_value", "texts")
                todo.append((doc_id, item["text"], metadata))
        paths = _strings(body, "paths")
        for p in paths or []:
            path = Path(p).expanduser()
            if not path.exists():
                raise ApiError(400, f"path {p} does not exist on the server; give files or folders it can read",
                               "invalid_value", "paths")
            todo.append(path.resolve())
        if not todo:
            raise ApiError(400, "nothing to ingest; send 'texts' (strings or {id, text, metadata}) or 'paths'",
                           "invalid_value", "texts")
        if len(todo) > MAX_INGEST_DOCUMENTS:
            raise ApiError(400, f"{len(todo)} documents in one request; send at most {MAX_INGEST_DOCUMENTS}",
                           "invalid_value", "texts")
        ids = [item[0] for item in todo if isinstance(item, tuple)]
        if len(set(ids)) != len(ids):
            raise ApiError(400, "a document id appears twice in 'texts'; give every document its own id",
                           "invalid_value", "texts")
        return JSONResponse(state.jobs.submit(todo).to_dict(), status_code=202)

    @app.get("/v1/jobs/{job_id}")
    async def job(job_id: str):
        found = state.jobs.get(job_id)
        if found is None:
            raise ApiError(404, f"no ingest job '{job_id}' on this server (jobs are kept until it stops)",
                           "job_not_found", "job_id")
        return found.to_dict()

    @app.get("/v1/models")
    async def models():
        loaded = state.pool.loaded()
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "cagkit",
                                            "loaded": name in loaded} for name in config.models]}

    @app.get("/health")
    async def health():
        return {"status": "ok", "models": list(config.models), "loaded": state.pool.loaded(),
                "store": str(config.store), "store_exists": state.reader.version() is not None}

    @app.get("/metrics")
    async def metrics():
        stats = await asyncio.to_thread(state.store_stats)
        text = state.metrics.render(config.models, state.pool.loaded(), stats)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _abandon(state: ServerState, job: Answering, future, done: asyncio.Future) -> None:
    """The client is gone: take the request off its model's queue, or stop its answer at the next token."""
    job.cancel.set()
    if future.cancel() or not future.done():
        state.metrics.cancelled(job.q.model)
    done.add_done_callback(_consume)


def _consume(done: asyncio.Future) -> None:
    """Read an abandoned answer's outcome, so that asyncio does not log it as never retrieved."""
    if not done.cancelled():
        done.exception()


def _final_body(job: Answering, done: asyncio.Future, kind: str, rid: str, created: int, arrived: float) -> dict:
    exc = done.exception()
    if exc is not None:
        if isinstance(exc, CagkitError):
            raise api_error(exc)
        raise exc
    answer, prompt, completion = done.result()
    queued_ms = _queued_ms(job)
    finish = "length" if completion >= job.q.max_new_tokens else "stop"
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": answer.answer}, "logprobs": None,
                  "finish_reason": finish}
    else:
        choice = {"index": 0, "text": answer.answer, "logprobs": None, "finish_reason": finish}
    return {"id": rid, "object": "chat.completion" if kind == "chat" else "text_completion", "created": created,
            "model": job.q.model, "choices": [choice], "usage": _usage(prompt, completion),
            "cagkit": _cagkit_part(answer, job, queued_ms)}


def _queued_ms(job: Answering) -> float:
    """Milliseconds the request waited for its model's thread (and for the model to load)."""
    return max((job.window[0] - job.arrived_wall) * 1e3, 0.0) if job.window else 0.0


def _sse(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


async def _events(job: Answering, done: asyncio.Future, future, kind: str, rid: str, created: int, arrived: float):
    """The answer as OpenAI's streamed chunks: text as it is generated, then the finish reason with the cagkit
    part (and the usage, when asked for), then `[DONE]`. A client that goes away stops the answer."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    model = job.q.model

    def chunk(piece: str | None, finish: str | None = None, **extra) -> dict:
        if kind == "chat":
            delta = {} if piece is None else {"content": piece}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice], **extra}

    complete = False
    started_text = False
    getter = None
    try:
        if kind == "chat":
            yield _sse({"id": rid, "object": obj, "created": created, "model": model,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                     "finish_reason": None}]})
        while True:
            if job.pieces.empty():
                if done.done():
                    break
                getter = asyncio.ensure_future(job.pieces.get())
                finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in finished:
                    getter.cancel()
                    continue
                piece = getter.result()
            else:
                piece = job.pieces.get_nowait()
            if not started_text:  # the answer is stripped; so is the start of the stream
                piece = piece.lstrip()
                if not piece:
                    continue
                started_text = True
            yield _sse(chunk(piece))
        exc = done.exception()
        if exc is not None:  # after the first piece only an internal error can end an answer early
            log.error("answer for %s failed mid-stream: %s", model, exc)
            error = api_error(exc) if isinstance(exc, CagkitError) else ApiError(
                500, f"internal error ({type(exc).__name__}); see the server's log", "internal_error",
                kind="server_error")
            yield _sse({"error": {"message": error.message, "type": error.kind, "param": error.param,
                                  "code": error.code}})
            complete = True
            yield _sse("[DONE]")
            return
        answer, prompt, completion = done.result()
        finish = "length" if completion >= job.q.max_new_tokens else "stop"
        yield _sse(chunk(None, finish, cagkit=_cagkit_part(answer, job, _queued_ms(job))))
        if job.q.include_usage:
            yield _sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                        "usage": _usage(prompt, completion)})
        complete = True
        yield _sse("[DONE]")
    finally:
        if getter is not None:
            getter.cancel()
        if not complete:
            _abandon(job.state, job, future, done)


def serve(config: ServeConfig) -> None:
    """Run the server until interrupted: check the configuration and the model names, then uvicorn."""
    import uvicorn

    from cagkit.models.registry import resolve

    config.check()
    for name in config.models:
        resolve(name)  # an unknown model fails now, in one line, not at the first request
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info("cagkit serve: store %s, models %s (at most %d loaded), loading them for http://%s:%d%s", config.store,
             ", ".join(config.models), config.max_loaded, config.host, config.port,
             " with an API key" if config.api_key else "")
    # On Ctrl-C, answers still streaming get this long to finish before they are stopped at their next token.
    uvicorn.run(create_app(config), host=config.host, port=config.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
