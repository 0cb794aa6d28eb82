"""`cagkit ask`: retrieve chunks, bring their KV into the target's cache, prefill only the question, generate.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache

from cagkit.config import ASK_MODES as MODES
from cagkit.config import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODE,
    DEFAULT_MODEL,
    DEFAULT_RETRIEVAL,
    DEFAULT_SCOPE,
    DEFAULT_STORE,
    DEFAULT_TOP_K,
    DOCUMENT_BUDGET,
    SCOPES,
    Placement,
)
from cagkit.errors import CagkitError
from cagkit.generation import context_room, generate, prompt_parts
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.context import PlacedSource, PromptSource, SelectedSentences, context_source, owns_store
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefix_cache
from cagkit.kv.repair import blend as blend_chunks
from cagkit.kv.rope import RotaryTables
from cagkit.kv.selection import question_order
from cagkit.kv.warm import WarmCaches, WarmContext, cache_bytes
from cagkit.models.device import synchronize
from cagkit.models.loading import LoadedModel, load_model
from cagkit.retrieval.embeddings import embed_query
from cagkit.retrieval.rank import check_retrieval
from cagkit.retrieval.search import retrieve
from cagkit.store.store import ChunkGoneError, DamagedChunkError, Hit, Store, StoredChunk


@dataclass
class Answer:
    """The answer to one question, where it came from, and how long each step took."""

    answer: str
    sources: list[dict]
    timings: dict
    model: str
    mode: str
    context_tokens: int = 0
    placement: dict = field(default_factory=dict)  # the ask-time options that shaped the context; {} for native
    retrieval: str | None = None  # how `ask` ranked the chunks (`cagkit.retrieval`); None when they were given
    # retrieved chunks left out: their stored KV is damaged, or their document was replaced since the search
    # ({"document", "chunk", "reason": "damaged" or "replaced", "error"} each), and documents left out at
    # document scope for room ({"document", "reason": "no_room", "error"})
    skipped: list[dict] = field(default_factory=list)
    scope: str = "chunks"  # what was placed: whole `document`s or the retrieved `chunks`
    documents: list[str] = field(default_factory=list)  # at document scope, the documents placed, in order
    warm: bool = False  # the context was a copy of one kept from an earlier question (`cagkit.kv.warm`)

    def to_dict(self) -> dict:
        return asdict(self)


def ask(
    question: str,
    store: str | Path | Store = DEFAULT_STORE,
    model: str = DEFAULT_MODEL,
    top_k: int = DEFAULT_TOP_K,
    mode: str = DEFAULT_MODE,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    on_text: Callable[[str], None] | None = None,
    recompute_layers: int = Placement.recompute_layers,
    blend: float | None = None,
    blend_select: str = Placement.blend_select,
    device: str | None = None,
    retrieval: str = DEFAULT_RETRIEVAL,
    scope: str = DEFAULT_SCOPE,
) -> Answer:
    """Answer `question` from the documents in `store` with `model`.

    Args:
        question: the question.
        store: a store directory (or an open Store).
        model: the target model (alias, Hugging Face id or model directory).
        top_k: how many chunks to retrieve.
        mode: where the target's context comes from. `select` (the default): the target prefills only the
            sentences of the context closest to the question (a share `blend` of the context tokens, in document
            order) and reads no stored KV at all; no other mode has answered both sooner and no worse beyond noise
            on the measured runs (docs/document-caches.md). `stored`: the stored KV, as it is for the store's own
            model (at document scope, native prefill's cache), translated by the trained Mixture-of-Translators
            for another target (`mot` is its older name); `linear` or `projector`: the same with single-path
            baseline translators. `auto`: `stored` where the store holds the target's own KV (it wrote the
            store), `select` elsewhere (`resolve_mode`), as a server over one store for several models wants. `native`:
            the target prefills the chunk text itself (the reference). `oracle` is a diagnostic: the target
            prefills each chunk alone after its sink token, the cache a perfect translator would produce, so it
            shows what the store's layout (chunks that never attend to each other) costs by itself.
        max_new_tokens: the longest answer, in tokens.
        on_text: called with each new piece of the answer as it is generated (streaming).
        recompute_layers: with a translated mode, the target recomputes its bottom this many layers over each
            chunk (a partial prefill, about this share of a native one) and only the layers above are
            translated (the injection depth; 0 = the translator's default).
        blend: the share of context tokens the target recomputes with attention across all placed chunks (see
            `Placement`); 0 places them exactly as stored or translated (fastest). None (the default): 0 at
            document scope, where each document was prefilled whole, and 0.15 for chunks; with `select` always
            0.15 unless given: the share of the context tokens whose sentences the target reads.
        blend_select: which tokens the blend recomputes: `question` (the sentences most similar to the
            question) or `deviation` (CacheBlend's choice).
        device: where the target runs: `auto` (default, or `$CAGKIT_DEVICE`: CUDA when there is a GPU), `cpu`,
            `cuda` or `cuda:N`. Stored and translated KV is moved there as it is placed.
        retrieval: how the chunks are ranked: `hybrid` (default: the embedding's and BM25's rankings fused),
            `dense` (the embedding alone) or `lexical` (BM25 alone); see `cagkit.retrieval`.
        scope: what is placed (`choose_scope`): `document` (the documents of the retrieved chunks, each whole,
            its chunks in order), `chunks` (the retrieved chunks, in document order) or `auto` (the default: for
            the modes that place stored KV, documents when they fit `cagkit.config.DOCUMENT_BUDGET` and the
            target's context, chunks otherwise; chunks for `select`, `native` and `oracle`).
    """
    if mode not in MODES:
        raise CagkitError(f"unknown --mode '{mode}'; use one of {', '.join(MODES)}")
    check_scope(scope)
    check_retrieval(retrieval)
    if not question.strip():
        raise CagkitError("the question is empty; pass the question as the last argument")
    if max_new_tokens < 1:
        raise CagkitError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if top_k < 1:
        raise CagkitError(f"--top-k must be at least 1, got {top_k}")
    given = Placement(recompute_layers, Placement.blend if blend is None else blend, blend_select)
    given.check()
    if mode == "select":
        SelectedSentences.check(given)
    opened = Store.open(store) if isinstance(store, (str, Path)) else store
    try:
        loading = time.perf_counter()
        lm = load_model(model, device)
        model_ms = (time.perf_counter() - loading) * 1e3
        prompt = prompt_parts(lm, question)  # tokenised once, for the room here and the answer
        room = context_room(lm, *prompt, max_new_tokens)  # the question itself must fit
        mode = resolve_mode(mode, lm, opened)
        t0 = time.perf_counter()
        vector = embed_query(question)  # embedded once, for retrieval and the sentences chosen by the question
        hits = retrieve(opened, question, top_k, retrieval, vector=vector)
        placed, used, left_out = choose_scope(opened, hits, scope, room, mode)
        t1 = time.perf_counter()
        placement = Placement(recompute_layers, default_blend(mode, used) if blend is None else blend, blend_select)
        answer = answer_from_chunks(lm, opened, placed, question, mode, max_new_tokens, on_text, started=t0,
                                    retrieved=t1, placement=placement, scope=used, sources=hits, prompt=prompt,
                                    vector=vector)
        answer.retrieval = retrieval
        answer.timings["model_ms"] = model_ms
        answer.skipped = left_out + answer.skipped
        return answer
    finally:
        if opened is not store:
            opened.close()


def check_scope(scope: str) -> None:
    """Refuse an unknown `--scope` before any model loads."""
    if scope not in SCOPES:
        raise CagkitError(f"unknown --scope '{scope}'; use one of {', '.join(SCOPES)}")


def resolve_mode(mode: str, lm: LoadedModel, store: Store) -> str:
    """`mode`, with `auto` made concrete: `stored` where `store` holds `lm`'s own KV (the target wrote it), so a
    document placed from it is native prefill's cache; `select` elsewhere, where no translated mode has beaten
    prefilling the question's sentences (docs/document-caches.md)."""
    if mode != "auto":
        return mode
    return "stored" if owns_store(lm, store) else "select"


def default_blend(mode: str, scope: str) -> float:
    """The share recomputed when `--blend` is not given: none at document scope for the modes that place KV (each
    document was prefilled whole), `Placement.blend` otherwise (and always for `select`, whose share it is)."""
    return 0.0 if scope == "document" and mode != "select" else Placement.blend


# The modes `--scope auto` reads whole documents for: those that place stored KV, where a document cached whole
# costs no more to read than its chunks. `select` and `native` read text, and were measured at chunk scope.
DOCUMENT_MODES = ("stored", "mot", "linear", "projector")


def choose_scope(store: Store, hits: list[Hit], scope: str, room: int,
                 mode: str = "stored") -> tuple[list[Hit], str, list[dict]]:
    """What to place for the retrieved `hits` in `mode`: (the chunks to place, the scope used, documents left out).
    `room`: the context tokens the target has beside the prompt and the answer (`cagkit.generation.context_room`);
    whole documents get at most `cagkit.config.DOCUMENT_BUDGET` of it (`budget`).

    `document`: the documents of `hits`, each whole (every chunk, in order; `build_context_cache` places them
    by path), as many as fit `budget` tokens taken in the order of their best hit; a document that does not fit is left out (reason `no_room`), and when not even
    the first fits, the error names its size and `--scope chunks`. `chunks`: `hits` themselves. `auto`: for the
    modes that place stored KV (`DOCUMENT_MODES`), the documents when all of them fit, else `hits`; for the
    others (`select`, `native`, `oracle`), `hits`."""
    check_scope(scope)
    if scope == "chunks" or not hits or (scope == "auto" and mode not in DOCUMENT_MODES):
        return hits, "chunks", []
    budget = min(room, DOCUMENT_BUDGET)
    order = list(dict.fromkeys(h.doc_path for h in hits))
    sizes = {}
    for path in order:
        doc = store.document(path)
        sizes[path] = doc.n_tokens if doc is not None else 0
    if scope == "auto" and sum(sizes.values()) > budget:
        return hits, "chunks", []
    documents = [(path, store.document_hits(path)) for path in order]
    placed, left_out, used = [], [], 0
    for path, doc_hits in documents:
        size = sizes.get(path, 0)
        if not doc_hits or used + size > budget:
            if not placed and doc_hits:
                raise CagkitError(f"document {path} is {size} tokens, over the {budget} the target has room for "
                                  f"at document scope; pass --scope chunks (or auto) to place its retrieved chunks")
            left_out.append({"document": path, "reason": "no_room" if doc_hits else "replaced",
                             "error": f"{size} tokens, {budget - used} left of {budget}" if doc_hits
                             else "no longer in the store"})
            continue
        placed += doc_hits
        used += size
    return placed, "document", left_out


def answer_from_chunks(
    lm: LoadedModel,
    store: Store,
    hits: list[Hit],
    question: str,
    mode: str,
    max_new_tokens: int,
    on_text: Callable[[str], None] | None = None,
    started: float | None = None,
    retrieved: float | None = None,
    placement: Placement = Placement(),
    scope: str = "chunks",
    sources: list[Hit] | None = None,
    prompt: tuple[list[int], list[int]] | None = None,
    vector=None,
    warm: WarmCaches | None = None,
) -> Answer:
    """Answer `question` with `lm` from the given chunks (the part of `ask` after retrieval and `choose_scope`).

    The chunks are placed in document order, whatever their scores, so text that belongs together reads in order.
    `sources`: the retrieved chunks to name as the answer's sources (default: `hits`). `prompt` (the question's
    `prompt_parts`) and `vector` (its embedding): where the caller made them already, so they are not made again.
    `warm`: contexts kept from earlier questions (`build_context_cache`).
    """
    started = started or time.perf_counter()
    retrieved = retrieved or started
    context = build_context_cache(lm, store, hits, question, mode, placement, scope, prompt, vector, warm=warm)
    gen = generate(lm, context.cache, context.pending_ids, max_new_tokens, on_text)
    end = time.perf_counter()
    decoded = max(len(gen.token_ids) - 1, 0)
    before = (context.loaded_at - retrieved) * 1e3  # reading stored KV, or a prompt source choosing its text
    timings = {
        "model_ms": 0.0,  # `ask` sets it: loading the target, before the question's clock starts (0 once loaded)
        "retrieve_ms": (retrieved - started) * 1e3,
        "load_ms": before if context.reads_kv else 0.0,
        "select_ms": 0.0 if context.reads_kv else before,
        "translate_ms": context.translate_s * 1e3,
        "repair_ms": context.repair_s * 1e3,
        "place_ms": context.place_s * 1e3,
        "prefill_ms": (gen.first_token_at - context.loaded_at - context.translate_s - context.place_s) * 1e3,
        "ttft_ms": (gen.first_token_at - started) * 1e3,
        "total_ms": (end - started) * 1e3,
        "tokens_per_s": decoded / gen.decode_s if decoded and gen.decode_s else 0.0,
    }
    gone = {(s["document"], s["chunk"]) for s in context.skipped}
    named = [{"document": h.doc_path, "chunk": h.idx, "score": round(h.score, 4)} for h in (sources or hits)
             if (h.doc_path, h.idx) not in gone]
    documents = list(dict.fromkeys(h.doc_path for h in hits)) if scope == "document" else []
    return Answer(gen.text, named, timings, lm.name, context.mode, context.context_tokens, context.placement,
                  skipped=context.skipped, scope=scope, documents=documents, warm=context.warm)


@dataclass
class ContextCache:
    """The target's cache holding the prompt up to the question, and the tokens still to prefill after it."""

    cache: DynamicCache
    pending_ids: list[int]  # the question suffix; for a prompt source (native, select) the whole prompt
    context_tokens: int
    loaded_at: float  # perf_counter time the chunks were loaded (native: tokenised; select: selected and tokenised)
    translate_s: float  # translation plus the repair (recomputed bottom layers, blend); 0 for a prompt source
    mode: str  # the mode used: "reuse" when the target is the store's source model
    repair_s: float = 0.0  # the repair's part of `translate_s`
    placement: dict = field(default_factory=dict)  # the options that shaped it (`ContextSource.settings`)
    skipped: list[dict] = field(default_factory=list)  # chunks left out as damaged or replaced (`load_chunks`)
    place_s: float = 0.0  # placing the KV into the target's cache (RoPE at its positions), after the repair
    reads_kv: bool = True  # False for a prompt source, whose time before `loaded_at` chose and tokenised its text
    warm: bool = False  # a copy of a context kept in `cagkit.kv.warm.WarmCaches`: nothing was read or placed


def build_context_cache(lm: LoadedModel, store: Store, hits: list[Hit], question: str, mode: str,
                        placement: Placement = Placement(), scope: str = "chunks",
                        prompt: tuple[list[int], list[int]] | None = None, vector=None,
                        warm: WarmCaches | None = None) -> ContextCache:
    """Bring the chunks of `hits` into `lm`'s cache for `question`, stopping before the question is prefilled.

    The context's source is chosen once (`cagkit.kv.context.context_source`). The chunks are placed in document
    order, whatever their scores, so text that belongs together reads in order. A prompt source (native, select)
    leaves the cache empty and the whole prompt pending, as a target without cagkit would read it. Otherwise the
    steps are: load the chunks, their KV from the source (`translate_s` starts), the repair (`repair_s`: the
    target's recomputed bottom layers, then `placement.blend`), and the placing; `ask` prints the two parts of
    `translate_s` as "translate" and "repair". `prompt` and `vector` as for `answer_from_chunks`. With `warm`, a
    context placed with blend 0 is kept there and a later question on the same chunks starts from it
    (`cagkit.kv.warm`): nothing is read or placed.
    """
    placement.check(lm)
    source = context_source(resolve_mode(mode, lm, store), lm, store, placement, scope)
    prefix_ids, suffix_ids = prompt if prompt is not None else prompt_parts(lm, question)
    placed = sorted(hits, key=lambda h: (h.doc_path, h.idx))
    if isinstance(source, PromptSource):
        context_ids = source.context_ids(lm, placed, question, vector)
        loaded_at = time.perf_counter()
        return ContextCache(prefix_cache(lm.model, []), prefix_ids + context_ids + suffix_ids, len(context_ids),
                            loaded_at, 0.0, source.mode, placement=source.settings(placement), reads_kv=False)
    settings = source.settings(placement)
    key = None
    if warm is not None and not placement.blend:
        key = (lm.name, lm.fingerprint, str(store.path), tuple(h.chunk_id for h in placed), source.mode,
               json.dumps(settings, sort_keys=True, default=str), tuple(prefix_ids))
        looked_up = time.perf_counter()
        found = warm.get(key)  # with a copy of the kept cache for this question: its placing
        if found is not None:
            entry, cache = found
            return ContextCache(cache, suffix_ids, entry.context_tokens, looked_up, 0.0, entry.mode, 0.0,
                                entry.placement, list(entry.skipped), place_s=time.perf_counter() - looked_up,
                                warm=True)
    chunks, skipped = load_chunks(store, placed)
    loaded_at = time.perf_counter()
    kvs, ids = source.chunk_kv(lm, chunks)
    tables = RotaryTables(lm.model)
    synchronize(lm.device)
    translated_at = time.perf_counter()
    kvs = repair(lm, source, chunks, kvs, ids, prefix_ids, question, placement, tables, vector)
    synchronize(lm.device)
    repaired_at = time.perf_counter()
    cache = place(lm, prefix_ids, kvs, tables)
    tokens = sum(kv.num_tokens for kv in kvs)
    if key is not None:  # kept for the next question; this one extends a copy
        cache = warm.put(key, WarmContext(cache, tokens, source.mode, settings, skipped, cache_bytes(cache)))
    synchronize(lm.device)
    return ContextCache(cache, suffix_ids, tokens, loaded_at, repaired_at - loaded_at, source.mode,
                        repaired_at - translated_at, settings, skipped,
                        place_s=time.perf_counter() - repaired_at)


def load_chunks(store: Store, hits: list[Hit]) -> tuple[list[StoredChunk], list[dict]]:
    """The stored chunks of `hits`, text and source KV, in the order given, each checked against its checksum as
    it is read. Left out, for the answer's `skipped` ({"document", "chunk", "reason", "error"} each): the damaged
    ones (reason `damaged`) and those whose document another writer replaced or removed since the search
    (`replaced`). When every chunk is left out, the first one's error (it names the fix) is raised."""
    chunks, skipped, first = [], [], None
    for h, chunk in zip(hits, store.load_chunks([h.chunk_id for h in hits])):
        if isinstance(chunk, StoredChunk) and (chunk.doc_path, chunk.idx, chunk.text) != (h.doc_path, h.idx, h.text):
            chunk = ChunkGoneError(f"chunk {h.chunk_id} of store {store.path} is no longer chunk {h.idx} of "
                                   f"{h.doc_path} as found (its id went to a new row): its document was replaced or "
                                   f"removed since; try again")
        if isinstance(chunk, StoredChunk):
            chunks.append(chunk)
            continue
        first = first or chunk
        reason = "damaged" if isinstance(chunk, DamagedChunkError) else "replaced"
        skipped.append({"document": h.doc_path, "chunk": h.idx, "reason": reason, "error": str(chunk)})
    if first is not None and not chunks:
        raise first
    return chunks, skipped


def repair(lm: LoadedModel, source: PlacedSource, chunks: list[StoredChunk], kvs: list[ChunkKV],
           ids: list[list[int]], prefix_ids: list[int], question: str, placement: Placement,
           tables: RotaryTables, vector=None) -> list[ChunkKV]:
    """`kvs` (per chunk [L, T, H, D], `ids` its token ids) after the target's own work on them: the layers the
    source leaves to it over each chunk alone (`PlacedSource.recompute`), then the cross-chunk blend of a share
    `placement.blend` of the tokens, chosen by the question's sentences or by deviation."""
    kvs = source.recompute(lm, chunks, kvs)
    if not placement.blend:
        return kvs
    priority = None
    if placement.blend_select == "question":
        offsets = [_token_offsets(lm, c, chunk_ids) for c, chunk_ids in zip(chunks, ids)]
        priority = question_order(question, [c.text for c in chunks], offsets, [c.sentences for c in chunks],
                                  vector)
    return blend_chunks(lm.model, prefix_ids, kvs, ids, placement.blend, tables, priority)


def place(lm: LoadedModel, prefix_ids: list[int], kvs: list[ChunkKV], tables: RotaryTables) -> DynamicCache:
    """`lm`'s cache of the prompt prefix `prefix_ids` prefilled, then the chunks `kvs` placed after it."""
    cache = prefix_cache(lm.model, prefix_ids)
    place_chunks(lm.model, cache, kvs, tables)
    return cache


def _token_offsets(lm: LoadedModel, chunk: StoredChunk, ids: list[int]) -> torch.Tensor:
    """[T, 2] character spans in `chunk.text` of the chunk's KV positions `ids` (the target's tokens)."""
    if list(ids) == list(chunk.token_ids):
        return torch.as_tensor(chunk.offsets)
    enc = lm.tokenizer(chunk.text, add_special_tokens=False, return_offsets_mapping=True)
    if enc["input_ids"] != list(ids):
        raise CagkitError(f"{lm.name} tokenised a chunk of {chunk.doc_path} differently from its KV; this is a bug, "
                          "please report it")
    return torch.tensor(enc["offset_mapping"]).reshape(-1, 2)
