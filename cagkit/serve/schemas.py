"""The bodies of `cagkit serve`'s requests and responses: parsing and checking what a client sends, and the
OpenAI-style JSON (and streamed chunks) it gets back.

Request bodies are parsed here, by hand, so that every bad input gets the OpenAI error body
(`{"error": {"message", "type", "param", "code"}}`) with a 4xx status rather than FastAPI's own 422 layout.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

from fastapi.responses import JSONResponse

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
from cagkit.serve.engine import ContextTooLong, Question
from cagkit.serve.store import StoreMissing

MAX_TOP_K = 64  # chunks one request may retrieve: more would only fill the model's context
MAX_NEW_TOKENS = 8192  # the most answer tokens one request may ask for (the model's context bounds it further)
MAX_INGEST_DOCUMENTS = 1000  # documents one POST /v1/ingest may carry
# The longest question or query read, checked before it waits for a model or the embedder: about 250k tokens of
# ordinary text, far past the shipped models' contexts (at most 32k tokens); what is shorter but still too long for
# its model is refused once tokenised, on the model's thread (a second for a million characters).
MAX_QUESTION_CHARS = 1_000_000


class ApiError(Exception):
    """A request the server refuses, as OpenAI's error body and an HTTP status."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


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


def internal_error(exc: BaseException) -> ApiError:
    """The HTTP error for anything else that went wrong (logged by the caller)."""
    return ApiError(500, f"internal error ({type(exc).__name__}); see the server's log", "internal_error",
                    kind="server_error")


# -- request bodies ----------------------------------------------------------------------------------------------


def parse_body(raw: bytes) -> dict:
    """A request's body as a JSON object."""
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


def parse_question(body: dict, kind: str, served: tuple[str, ...]) -> Question:
    """A completion request (`kind` "chat" or "text") for one of the `served` models."""
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


@dataclass
class Query:
    """What a POST /v1/retrieve asks."""

    query: str
    top_k: int
    retrieval: str
    documents: list[str] | None


def parse_query(body: dict) -> Query:
    query = body.get("query", body.get("question"))
    if not isinstance(query, str) or not query.strip():
        raise ApiError(400, "'query' must be a non-empty string: the question to retrieve chunks for",
                       "invalid_value", "query")
    _check_length(query, "query", "query")
    return Query(query, _int(body, "top_k", DEFAULT_TOP_K, 1, 1000),
                 _choice(body, "retrieval", DEFAULT_RETRIEVAL, RETRIEVAL_MODES), _strings(body, "documents"))


def parse_ingest(body: dict) -> list:
    """What a POST /v1/ingest sends: (id, text, metadata) for each text, and a resolved path for each path."""
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
    return todo


# -- response bodies ---------------------------------------------------------------------------------------------


def retrieved_body(hits, retrieval: str, retrieve_ms: float) -> dict:
    return {"object": "list", "retrieval": retrieval,
            "data": [{"document": h.doc_path, "chunk": h.idx, "chunk_id": h.chunk_id, "score": round(h.score, 4),
                      "text": h.text, "metadata": h.metadata} for h in hits],
            "timings": {"retrieve_ms": retrieve_ms}}


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(completion: int, max_new_tokens: int) -> str:
    return "length" if completion >= max_new_tokens else "stop"


def cagkit_part(answer, window: list[float], queued_ms: float) -> dict:
    """The `cagkit` part of a completion: sources, timings (with the time queued) and how it was answered;
    `window`: the wall-clock start and end of the answer on its model's thread."""
    timings = dict(answer.timings, queue_ms=queued_ms)
    return {"sources": answer.sources, "timings": timings, "mode": answer.mode, "retrieval": answer.retrieval,
            "context_tokens": answer.context_tokens, "placement": answer.placement,
            "scope": answer.scope, "documents": answer.documents, "warm": answer.warm,
            # retrieved chunks left out because their stored KV is damaged (where cagkit.ask reports them)
            "skipped": answer.skipped,
            "served": {"start": window[0], "end": window[-1]} if window else None}


class Completion:
    """The OpenAI bodies of one completion (`kind` "chat" or "text"): whole, or as streamed chunks."""

    def __init__(self, kind: str, model: str, created: int):
        self.kind, self.model, self.created = kind, model, created
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"

    def body(self, text: str, finish: str, usage: dict, cagkit: dict) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {"id": self.id, "object": "chat.completion" if self.kind == "chat" else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": usage, "cagkit": cagkit}

    def _chunk(self, choices: list, **extra) -> dict:
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices,
                **extra}

    def role_chunk(self) -> dict:
        """A chat stream's first chunk: the assistant's role."""
        return self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                             "finish_reason": None}])

    def chunk(self, piece: str | None, finish: str | None = None, **extra) -> dict:
        if self.kind == "chat":
            delta = {} if piece is None else {"content": piece}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
        return self._chunk([choice], **extra)

    def usage_chunk(self, usage: dict) -> dict:
        return self._chunk([], usage=usage)


def sse(data: dict | str) -> bytes:
    """One server-sent event."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()
