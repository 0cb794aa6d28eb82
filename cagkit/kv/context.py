"""Where a target's context comes from for one question, chosen once from the mode, the store and the model
(`context_source`), the way transformers picks a cache layer class from the config.

Placed sources give each retrieved chunk's RoPE-free KV in the target's cache space, which `cagkit.ask` repairs
and places after the prompt's prefix:

    StoredKV           the target is the store's source model: the stored KV as it is
    TranslatedKV       a trained translator (mot, linear, projector), optionally under the target's own bottom layers
    ChunkAlonePrefill  the target prefills each chunk alone after its sink (the oracle: a perfect translator's output)

Prompt sources give token ids, which the target prefills natively together with the question:

    NativePrefill      the chunks' text (the reference)
    SelectedSentences  only the sentences the question selects (the `select` control: no stored KV read at all)
"""

from __future__ import annotations

import torch

from cagkit.config import Placement
from cagkit.errors import CagkitError
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.prefill import chunk_alone_kv
from cagkit.kv.selection import selected_sentences
from cagkit.models.loading import LoadedModel
from cagkit.store.store import Hit, Store, StoredChunk

CHUNK_SEPARATOR = "\n\n"  # between chunks where the target reads them as text


class ContextSource:
    """Where the target's context comes from. `mode` is what an answer records as its mode."""

    mode: str

    def settings(self, placement: Placement) -> dict:
        """The ask-time options that shaped this context, for the answer's record."""
        return placement.settings()


class PlacedSource(ContextSource):
    """Chunk KV the target places after its prompt prefix, loaded from the store (`Store.load_chunk`)."""

    def chunk_kv(self, lm: LoadedModel, chunks: list[StoredChunk]) -> tuple[list[ChunkKV], list[list[int]]]:
        """Per chunk, its RoPE-free KV [L, T, H, D] in `lm`'s cache space and its T token ids in `lm`'s vocabulary."""
        raise NotImplementedError

    def recompute(self, lm: LoadedModel, chunks: list[StoredChunk], kvs: list[ChunkKV]) -> list[ChunkKV]:
        """`kvs` with the layers the target recomputes over each chunk alone (the first step of the repair): none."""
        return kvs


class StoredKV(PlacedSource):
    """The target is the store's source model: the stored KV [L, T, H, D] (fp16 or as stored) as it is."""

    mode = "reuse"

    def chunk_kv(self, lm, chunks):
        return [c.kv for c in chunks], [list(c.token_ids) for c in chunks]


class TranslatedKV(PlacedSource):
    """The stored KV translated into the target's cache space [L_target, T_target, H, D] (fp32) by the `kind`
    translator (mot, linear or projector) from the store's source model; with `own_layers` > 0 its bottom
    `own_layers` layers are then replaced by the target's own partial prefill of each chunk."""

    def __init__(self, kind: str, store: Store, own_layers: int = 0) -> None:
        self.mode = kind
        self.source, self.source_fingerprint = store.settings.source, store.settings.source_fingerprint
        self.own_layers = own_layers

    def chunk_kv(self, lm, chunks):
        from cagkit.translate.translator import load_translator

        translator = load_translator(self.source, self.source_fingerprint, lm, kind=self.mode)
        pairs = translator.translate_many([(c.kv, c.token_ids, c.offsets, c.text) for c in chunks], lm)
        return [kv for kv, _ in pairs], [list(ids) for _, ids in pairs]

    def recompute(self, lm, chunks, kvs):
        if not self.own_layers:
            return kvs
        out = []
        for chunk, translated in zip(chunks, kvs, strict=True):
            own = chunk_alone_kv(lm, chunk.text, self.own_layers)  # [own_layers, T, H, D]
            if own.num_tokens != translated.num_tokens:
                raise CagkitError(f"the target tokenised a chunk into {own.num_tokens} tokens, the translation has "
                                  f"{translated.num_tokens}; this is a bug, please report it")
            out.append(ChunkKV(torch.cat([own.keys, translated.keys[self.own_layers:].float()]),
                               torch.cat([own.values, translated.values[self.own_layers:].float()])))
        return out


class ChunkAlonePrefill(PlacedSource):
    """The target's own KV [L, T, H, D] (fp32) of each chunk prefilled alone after its sink: the cache a perfect
    translator would give (`oracle`), and a translated mode whose every layer is recomputed by the target."""

    def __init__(self, mode: str = "oracle") -> None:
        self.mode = mode

    def chunk_kv(self, lm, chunks):
        ids = [lm.tokenizer(c.text, add_special_tokens=False)["input_ids"] for c in chunks]
        return [chunk_alone_kv(lm, c.text) for c in chunks], ids


class PromptSource(ContextSource):
    """Context the target prefills itself, as text, in one pass with the question: nothing is read from the store."""

    def context_ids(self, lm: LoadedModel, hits: list[Hit], question: str, vector=None) -> list[int]:
        """The token ids, in `lm`'s vocabulary, of the context of `hits` (in the order given) for `question`
        (`vector`: its embedding, where the caller has it)."""
        raise NotImplementedError


class NativePrefill(PromptSource):
    """The chunks' whole text, as a target without cagkit would read it: the reference. With `store` (document
    scope, `cagkit.ask.choose_scope`) and a target that is the store's source model, each document is read as the
    source read it at ingest: its stored token ids, the text between its chunks included, so a document placed
    from the store and this prefill hold the same tokens; other targets read the chunks' text."""

    mode = "native"

    def __init__(self, store: Store | None = None) -> None:
        self.store = store

    def settings(self, placement):
        return {}  # a native prefill places nothing

    def context_ids(self, lm, hits, question, vector=None):
        if self.store is not None and lm.fingerprint == self.store.settings.source_fingerprint:
            separator = lm.tokenizer(CHUNK_SEPARATOR, add_special_tokens=False)["input_ids"]
            ids, previous = [], None
            for hit, chunk_ids in zip(hits, self.store.token_ids([h.chunk_id for h in hits])):
                if previous is not None and hit.doc_path != previous:
                    ids += separator
                ids += chunk_ids
                previous = hit.doc_path
            return ids
        return lm.tokenizer(CHUNK_SEPARATOR.join(h.text for h in hits), add_special_tokens=False)["input_ids"]


class SelectedSentences(PromptSource):
    """Only the sentences of the chunks that the question-selected repair would recompute (`ratio` of the context
    tokens, `cagkit.kv.selection.selected_sentences`), in document order, one space between the sentences of a
    chunk and a blank line between chunks. It reads no stored KV, so it works on any store with any target."""

    mode = "select"

    def __init__(self, placement: Placement) -> None:
        self.check(placement)
        self.ratio = placement.blend

    @staticmethod
    def check(placement: Placement) -> None:
        """Refuse the placements `select` cannot choose sentences by."""
        if not placement.blend:
            raise CagkitError("select reads the sentences of a share --blend of the context tokens, and --blend is 0; "
                              "pass a share above 0 (default 0.15), or --mode mot to place the stored KV as it is")
        if placement.blend_select != "question":
            raise CagkitError(f"select chooses sentences by the question; --blend-select {placement.blend_select} "
                              "needs stored KV: leave --blend-select at question, or pass --mode mot")

    def settings(self, placement):
        return {"blend": self.ratio, "blend_select": "question"}  # all that shaped the selection

    def context_ids(self, lm, hits, question, vector=None):
        texts = [h.text for h in hits]
        kept = selected_sentences(lm.tokenizer, texts, question, self.ratio, vector)
        text = CHUNK_SEPARATOR.join(" ".join(t[a:b] for a, b in spans) for t, spans in zip(texts, kept) if spans)
        return lm.tokenizer(text, add_special_tokens=False)["input_ids"]


def owns_store(lm: LoadedModel, store: Store) -> bool:
    """Whether `store` holds `lm`'s own KV (it was written by the same model), so `stored` reads it as it is."""
    return lm.fingerprint == store.settings.source_fingerprint


def context_source(mode: str, lm: LoadedModel, store: Store, placement: Placement,
                   scope: str = "chunks") -> ContextSource:
    """The source of `lm`'s context for an answer in `mode` (one of `cagkit.config.ASK_MODES`, `auto` resolved)
    from `store`, placing whole documents or the retrieved chunks (`scope`)."""
    if mode == "native":
        return NativePrefill(store if scope == "document" else None)
    if mode == "select":
        return SelectedSentences(placement)
    if mode == "oracle":
        return ChunkAlonePrefill()
    if owns_store(lm, store):
        return StoredKV()
    kind = "mot" if mode == "stored" else mode  # `stored` translates through the pair's default translator
    if placement.recompute_layers == lm.num_layers:  # every layer the target's own: nothing to translate
        return ChunkAlonePrefill(kind)
    return TranslatedKV(kind, store, placement.recompute_layers)
