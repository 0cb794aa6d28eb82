"""`cagkit ask`: retrieve chunks, bring their KV into the target's cache, prefill only the question, generate.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache

from cagkit.config import ASK_MODES as MODES
from cagkit.config import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_MODEL,
    DEFAULT_RETRIEVAL,
    DEFAULT_STORE,
    DEFAULT_TOP_K,
    Placement,
)
from cagkit.errors import CagkitError
from cagkit.generation import generate, prompt_parts
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import chunk_alone_kv, prefix_cache
from cagkit.kv.repair import blend as blend_chunks
from cagkit.kv.repair import question_priority
from cagkit.kv.rope import RotaryTables
from cagkit.models.device import synchronize
from cagkit.models.loading import LoadedModel, load_model
from cagkit.retrieval.embeddings import embed_query, embed_sentences
from cagkit.retrieval.rank import check_retrieval
from cagkit.retrieval.search import retrieve
from cagkit.store.store import Hit, Store, StoredChunk


@dataclass
class Answer:
    """The answer to one question, where it came from, and how long each step took."""

    answer: str
    sources: list[dict]
    timings: dict
    model: str
    mode: str
    context_tokens: int = 0
    placement: dict = field(default_factory=dict)  # the ask-time options (`Placement.settings`); {} for native
    retrieval: str | None = None  # how `ask` ranked the chunks (`cagkit.retrieval`); None when they were given

    def to_dict(self) -> dict:
        return asdict(self)


def ask(
    question: str,
    store: str | Path | Store = DEFAULT_STORE,
    model: str = DEFAULT_MODEL,
    top_k: int = DEFAULT_TOP_K,
    mode: str = "mot",
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    on_text: Callable[[str], None] | None = None,
    recompute_layers: int = Placement.recompute_layers,
    blend: float = Placement.blend,
    blend_select: str = Placement.blend_select,
    device: str | None = None,
    retrieval: str = DEFAULT_RETRIEVAL,
) -> Answer:
    """Answer `question` from the documents in `store` with `model`.

    Args:
        question: the question.
        store: a store directory (or an open Store).
        model: the target model (alias, Hugging Face id or model directory).
        top_k: how many chunks to retrieve.
        mode: how the target gets the chunks' KV when it is not the store's source model: `mot` (the trained
            Mixture-of-Translators), `linear` or `projector` (single-path baselines), or `native` (the target
            prefills the chunk text itself: the reference). When the target is the source model, `mot`,
            `linear` and `projector` all reuse the stored cache as it is. `oracle` is a diagnostic: the target
            prefills each chunk alone after its sink token, the cache a perfect translator would produce, so
            it shows what the store's layout (chunks that never attend to each other) costs by itself.
        max_new_tokens: the longest answer, in tokens.
        on_text: called with each new piece of the answer as it is generated (streaming).
        recompute_layers: with a translated mode, the target recomputes its bottom this many layers over each
            chunk (a partial prefill, about this share of a native one) and only the layers above are
            translated (the injection depth; 0 = the translator's default).
        blend: the share of context tokens the target recomputes with attention across all retrieved chunks
            (see `Placement`); 0 places the chunks exactly as stored or translated (fastest).
        blend_select: which tokens the blend recomputes: `question` (the sentences most similar to the
            question) or `deviation` (CacheBlend's choice).
        device: where the target runs: `auto` (default, or `$CAGKIT_DEVICE`: CUDA when there is a GPU), `cpu`,
            `cuda` or `cuda:N`. Stored and translated KV is moved there as it is placed.
        retrieval: how the chunks are ranked: `hybrid` (default: the embedding's and BM25's rankings fused),
            `dense` (the embedding alone) or `lexical` (BM25 alone); see `cagkit.retrieval`.
    """
    if mode not in MODES:
        raise CagkitError(f"unknown --mode '{mode}'; use one of {', '.join(MODES)}")
    check_retrieval(retrieval)
    if not question.strip():
        raise CagkitError("the question is empty; pass the question as the last argument")
    if max_new_tokens < 1:
        raise CagkitError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    opened = store if isinstance(store, Store) else Store.open(store)
    try:
        lm = load_model(model, device)
        t0 = time.perf_counter()
        hits = retrieve(opened, question, top_k, retrieval)
        t1 = time.perf_counter()
        answer = answer_from_chunks(lm, opened, hits, question, mode, max_new_tokens, on_text, started=t0,
                                    retrieved=t1, placement=Placement(recompute_layers, blend, blend_select))
        answer.retrieval = retrieval
        return answer
    finally:
        if opened is not store:
            opened.close()


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
) -> Answer:
    """Answer `question` with `lm` from the given retrieved chunks (the part of `ask` after retrieval).

    The chunks are placed in document order, whatever their scores, so text that belongs together reads in order.
    """
    started = started or time.perf_counter()
    retrieved = retrieved or started
    context = build_context_cache(lm, store, hits, question, mode, placement)
    gen = generate(lm, context.cache, context.pending_ids, max_new_tokens, on_text)
    end = time.perf_counter()
    decoded = max(len(gen.token_ids) - 1, 0)
    timings = {
        "retrieve_ms": (retrieved - started) * 1e3,
        "load_ms": (context.loaded_at - retrieved) * 1e3,
        "translate_ms": context.translate_s * 1e3,
        "repair_ms": context.repair_s * 1e3,
        "prefill_ms": (gen.first_token_at - context.loaded_at - context.translate_s) * 1e3,
        "ttft_ms": (gen.first_token_at - started) * 1e3,
        "total_ms": (end - started) * 1e3,
        "tokens_per_s": decoded / gen.decode_s if decoded and gen.decode_s else 0.0,
    }
    sources = [{"document": h.doc_path, "chunk": h.idx, "score": round(h.score, 4)} for h in hits]
    recorded = placement.settings() if mode != "native" else {}  # a native prefill places nothing
    return Answer(gen.text, sources, timings, lm.name, context.mode, context.context_tokens, recorded)


@dataclass
class ContextCache:
    """The target's cache holding the prompt up to the question, and the tokens still to prefill after it."""

    cache: DynamicCache
    pending_ids: list[int]  # the question suffix; in native mode the whole prompt, prefilled in one pass
    context_tokens: int
    loaded_at: float  # perf_counter time the chunks were loaded (native: tokenised)
    translate_s: float  # translation plus the repair (recomputed bottom layers, blend); 0 in native mode
    mode: str  # the mode used: "reuse" when the target is the store's source model
    repair_s: float = 0.0  # the repair's part of `translate_s`


def build_context_cache(lm: LoadedModel, store: Store, hits: list[Hit], question: str, mode: str,
                        placement: Placement = Placement()) -> ContextCache:
    """Bring the chunks of `hits` into `lm`'s cache for `question`, stopping before the question is prefilled.

    The chunks are placed in document order, whatever their scores, so text that belongs together reads in order.
    Native mode leaves the cache empty and the whole prompt pending, as a target without cagkit would read it.
    `placement.recompute_layers` (translated modes only) replaces the bottom layers of each translated chunk with
    the target's own partial prefill of the chunk; `placement.blend` then repairs cross-chunk attention (every
    mode but native). Their time counts in `translate_s` (from the chunks' loading to the placed cache) and, apart,
    in `repair_s`; `ask` prints the two parts as "translate" and "repair".
    """
    placement.check(lm)
    recompute_layers = placement.recompute_layers
    prefix_ids, suffix_ids = prompt_parts(lm, question)
    placed = sorted(hits, key=lambda h: (h.doc_path, h.idx))
    if mode == "native":
        chunk_text = "\n\n".join(h.text for h in placed)
        context_ids = lm.tokenizer(chunk_text, add_special_tokens=False)["input_ids"]
        loaded_at = time.perf_counter()
        cache = prefix_cache(lm.model, [])
        return ContextCache(cache, prefix_ids + context_ids + suffix_ids, len(context_ids), loaded_at, 0.0, mode)
    stored = [store.load_chunk(h.chunk_id) for h in placed]
    loaded_at = time.perf_counter()
    if mode == "oracle" or (recompute_layers == lm.num_layers and not _same_model(lm, store)):
        # every layer the target's own: nothing to translate
        ids = [lm.tokenizer(c.text, add_special_tokens=False)["input_ids"] for c in stored]
        kvs = [chunk_alone_kv(lm, c.text) for c in stored]
    else:
        kvs, ids = _target_kv(lm, store, stored, mode)
    tables = RotaryTables(lm.model)
    synchronize(lm.device)
    translated_at = time.perf_counter()
    if 0 < recompute_layers < lm.num_layers and mode != "oracle" and not _same_model(lm, store):
        kvs = [_recompute_bottom(lm, c.text, kv, recompute_layers) for c, kv in zip(stored, kvs)]
    if placement.blend:
        priority = None
        if placement.blend_select == "question":
            offsets = [_token_offsets(lm, c, chunk_ids) for c, chunk_ids in zip(stored, ids)]
            priority = question_priority(embed_query(question), _sentences(stored), offsets)
        kvs = blend_chunks(lm.model, prefix_ids, kvs, ids, placement.blend, tables, priority)
    synchronize(lm.device)
    repaired_at = time.perf_counter()
    cache = prefix_cache(lm.model, prefix_ids)
    place_chunks(lm.model, cache, kvs, tables)
    used = "reuse" if _same_model(lm, store) and mode != "oracle" else mode
    return ContextCache(cache, suffix_ids, sum(kv.num_tokens for kv in kvs), loaded_at, repaired_at - loaded_at, used,
                        repaired_at - translated_at)


def _recompute_bottom(lm: LoadedModel, text: str, translated: ChunkKV, layers: int) -> ChunkKV:
    """`translated` with its bottom `layers` layers replaced by the target's own partial prefill of `text`."""
    own = chunk_alone_kv(lm, text, layers)
    if own.num_tokens != translated.num_tokens:
        raise CagkitError(f"the target tokenised a chunk into {own.num_tokens} tokens, the translation has "
                          f"{translated.num_tokens}; this is a bug, please report it")
    return ChunkKV(torch.cat([own.keys, translated.keys[layers:].float()]),
                   torch.cat([own.values, translated.values[layers:].float()]))


_COMPUTED_SENTENCES: OrderedDict[str, tuple] = OrderedDict()  # chunk text -> (spans, embeddings), newest last
_COMPUTED_SENTENCES_MAX = 4096


def _sentences(chunks: list[StoredChunk]) -> list[tuple]:
    """Each chunk's sentence spans and embeddings: as the store keeps them, else computed now (stores ingested
    before cagkit kept them) and remembered for the next question in this process, which often retrieves the
    same chunks: embedding their sentences costs about as much as the repair itself."""
    missing = list(dict.fromkeys(c.text for c in chunks if c.sentences is None and c.text not in _COMPUTED_SENTENCES))
    for text, found in zip(missing, embed_sentences(missing) if missing else []):
        _COMPUTED_SENTENCES[text] = found
    out = []
    for c in chunks:
        if c.sentences is not None:
            out.append(c.sentences)
        else:
            _COMPUTED_SENTENCES.move_to_end(c.text)
            out.append(_COMPUTED_SENTENCES[c.text])
    while len(_COMPUTED_SENTENCES) > _COMPUTED_SENTENCES_MAX:
        _COMPUTED_SENTENCES.popitem(last=False)
    return out


def _token_offsets(lm: LoadedModel, chunk: StoredChunk, ids: list[int]) -> torch.Tensor:
    """[T, 2] character spans in `chunk.text` of the chunk's KV positions `ids` (the target's tokens)."""
    if list(ids) == list(chunk.token_ids):
        return torch.as_tensor(chunk.offsets)
    enc = lm.tokenizer(chunk.text, add_special_tokens=False, return_offsets_mapping=True)
    if enc["input_ids"] != list(ids):
        raise CagkitError(f"{lm.name} tokenised a chunk of {chunk.doc_path} differently from its KV; this is a bug, "
                          "please report it")
    return torch.tensor(enc["offset_mapping"]).reshape(-1, 2)


def _same_model(lm: LoadedModel, store: Store) -> bool:
    return lm.fingerprint == store.settings.source_fingerprint


def _target_kv(lm: LoadedModel, store: Store, chunks: list[StoredChunk], kind: str) -> tuple[list[ChunkKV], list[list[int]]]:
    """The chunks' KV in the target's cache space and their target token ids: as stored for the source model,
    else translated."""
    if _same_model(lm, store):
        return [c.kv for c in chunks], [list(c.token_ids) for c in chunks]
    from cagkit.translate.translator import load_translator

    translator = load_translator(store.settings.source, store.settings.source_fingerprint, lm, kind=kind)
    pairs = translator.translate_many([(c.kv, c.token_ids, c.offsets, c.text) for c in chunks], lm)
    return [kv for kv, _ in pairs], [list(ids) for _, ids in pairs]
