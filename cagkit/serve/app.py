"""The FastAPI app of `cagkit serve`: OpenAI-style completions over the store, retrieval, ingest, health, metrics.

    create_app(ServeConfig(store="stores/default", models=("smollm2",)))  # an ASGI app, for any ASGI server
    serve(config)                                                         # what `cagkit serve` runs (uvicorn)

The routes only translate: a request's body into what it asks (`cagkit.serve.schemas`), that to the engine
(`cagkit.serve.engine`: the loaded models, their queues, cancellation, streaming), and the engine's answer back
into a response body or a stream of server-sent events.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from cagkit.errors import CagkitError
# CHUNK_MARGIN_TOKENS, ContextTooLong, MAX_*, Question: importable from here, as before the engine and the
# schemas had modules of their own
from cagkit.serve.engine import (  # noqa: F401
    CHUNK_MARGIN_TOKENS,
    Answering,
    Cancelled,
    ContextTooLong,
    Question,
    ServerState,
)
from cagkit.serve.schemas import (  # noqa: F401
    MAX_INGEST_DOCUMENTS,
    MAX_NEW_TOKENS,
    MAX_QUESTION_CHARS,
    MAX_TOP_K,
    ApiError,
    Completion,
    api_error,
    cagkit_part,
    finish_reason,
    internal_error,
    parse_body,
    parse_ingest,
    parse_query,
    parse_question,
    retrieved_body,
    sse,
    usage,
)
from cagkit.serve.settings import ServeConfig

log = logging.getLogger("cagkit.serve")

SHUTDOWN_GRACE_S = 3  # seconds the answers in progress get to finish when the server is stopped


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
        return internal_error(exc).response()

    async def complete(request: Request, kind: str):
        arrived = time.perf_counter()
        q = parse_question(parse_body(await request.body()), kind, config.models)
        job = state.submit(q, arrived)
        finished = False
        try:
            await job.wait_first(request.is_disconnected)
            if job.done.done():
                _outcome(job)
            completion = Completion(kind, q.model, int(time.time()))
            if not q.stream:
                await job.wait_done(request.is_disconnected)  # the rest of the answer, watching for the client
                answer, prompt, tokens = _outcome(job)
                body = completion.body(answer.answer, finish_reason(tokens, q.max_new_tokens), usage(prompt, tokens),
                                       cagkit_part(answer, job.window, job.queued_ms()))
                finished = True
                return JSONResponse(body)
            finished = True  # the stream owns the answer from here
            return StreamingResponse(_events(job, completion), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        except Cancelled:
            return Response(status_code=499)  # nobody reads it; the counters show the request as cancelled
        finally:
            if not finished:
                job.abandon()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await complete(request, "chat")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await complete(request, "text")

    @app.post("/v1/retrieve")
    async def retrieve(request: Request):
        q = parse_query(parse_body(await request.body()))
        started = time.perf_counter()
        try:
            _, hits, _ = await asyncio.to_thread(state.retrieve, q.query, q.top_k, q.retrieval, q.documents)
        except CagkitError as exc:
            raise api_error(exc) from None
        return retrieved_body(hits, q.retrieval, (time.perf_counter() - started) * 1e3)

    @app.post("/v1/ingest", status_code=202)
    async def ingest(request: Request):
        todo = parse_ingest(parse_body(await request.body()))
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
        version = await asyncio.to_thread(state.reader.version)  # a LanceDB store on S3 asks the bucket
        return {"status": "ok", "models": list(config.models), "loaded": state.pool.loaded(),
                "store": str(config.store), "store_exists": version is not None}

    @app.get("/metrics")
    async def metrics():
        stats = await asyncio.to_thread(state.store_stats)
        text = state.metrics.render(config.models, state.pool.loaded(), stats, state.warm_stats())
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _outcome(job: Answering):
    """A finished answer's (answer, prompt tokens, answer tokens); the library's errors as HTTP errors."""
    try:
        return job.done.result()
    except CagkitError as exc:
        raise api_error(exc) from None


async def _events(job: Answering, completion: Completion):
    """The answer as OpenAI's streamed chunks: text as it is generated, then the finish reason with the cagkit
    part (and the usage, when asked for), then `[DONE]`. A client that goes away stops the answer."""
    complete = False
    try:
        if completion.kind == "chat":
            yield sse(completion.role_chunk())
        while (piece := await job.next_piece()) is not None:
            yield sse(completion.chunk(piece))
        exc = job.done.exception()
        if exc is not None:  # after the first piece only an internal error can end an answer early
            log.error("answer for %s failed mid-stream: %s", job.q.model, exc)
            error = api_error(exc) if isinstance(exc, CagkitError) else internal_error(exc)
            yield sse(error.body())
            complete = True
            yield sse("[DONE]")
            return
        answer, prompt, tokens = job.done.result()
        yield sse(completion.chunk(None, finish_reason(tokens, job.q.max_new_tokens),
                                   cagkit=cagkit_part(answer, job.window, job.queued_ms())))
        if job.q.include_usage:
            yield sse(completion.usage_chunk(usage(prompt, tokens)))
        complete = True
        yield sse("[DONE]")
    finally:
        if not complete:
            job.abandon()


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
