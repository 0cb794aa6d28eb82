"""`cagkit ingest`: read documents, chunk them, prefill each document once with the source model as it reads
it (part after part, each attending to the document before it), store each chunk's slice of that KV.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cagkit.config import DEFAULT_CHUNK_TOKENS, DEFAULT_PREFILL, DEFAULT_SOURCE, DEFAULT_STORE, PREFILL_KINDS
from cagkit.errors import CagkitError, DocumentError, SkippedDocumentWarning
from cagkit.ingest.chunking import Chunk, check_chunk_tokens, chunk_text
from cagkit.ingest.documents import document_path, find_documents, read_document
from cagkit.kv.prefill import SINK_TOKENS, DocumentPrefill, prefill_kv_batch
from cagkit.kv.rope import RotaryTables
from cagkit.models.loading import load_model
from cagkit.retrieval.embeddings import EMBEDDER_NAME, embed_with_sentences
from cagkit.store.store import DamagedManifestError, NewChunk, Store, StoreSettings, check_dtype


@dataclass
class IngestReport:
    """What one ingest run did."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    upgraded: list[str] = field(default_factory=list)  # documents whose KV files the store's migrations rewrote
    orphans: list[str] = field(default_factory=list)  # leftover KV files of cagkit's own removed from kv/
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    chunks: int = 0
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def ingest(
    paths: list[str | Path],
    store: str | Path = DEFAULT_STORE,
    source: str = DEFAULT_SOURCE,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    prune: bool = False,
    dtype: str = "float16",
    progress: bool = True,
    device: str | None = None,
    wait: bool = False,
    manifest: str = "sqlite",
    prefill: str = DEFAULT_PREFILL,
    window: int | None = None,
) -> IngestReport:
    """Add the documents under `paths` to `store`, prefilling each new or changed one with `source`.

    Args:
        paths: files and folders (searched recursively for .txt, .md, .rst, .html, .pdf).
        store: the store: a local folder, created on first use, or a URL (`s3://bucket/prefix`, with the scale
            extra).
        source: the model that prefills the chunks (alias, Hugging Face id or model directory).
        chunk_tokens: the most source tokens in one chunk.
        prune: drop documents from the store whose files no longer exist (documents added by `ingest_texts`,
            which have ids rather than files, are kept).
        dtype: how KV is stored: float16 (default), bfloat16, float32, or compressed: int8 or int4 (cagkit.kv.quant).
        progress: draw a progress bar on stderr.
        device: where the source model prefills: `auto` (default, or `$CAGKIT_DEVICE`: CUDA when there is a
            GPU), `cpu`, `cuda` or `cuda:N`. The stored KV is the same either way, up to rounding.
        wait: when another process is writing `store`, wait for it to finish instead of raising `StoreError`.
        manifest: for a new local store, what keeps its manifest: `sqlite` (the default, one machine) or `lance`
            (LanceDB, as a store at a URL always is: several writers at once, search indexes; the scale extra).
        prefill: how the source reads a document: `document` (the default: causally from its start, each part
            attending to everything before it up to `window`, so a chunk's KV is its slice of the document's
            cache) or `chunks` (each chunk alone, as stores written before document caches were).
        window: the most tokens one document token attends over (the prompt prefix included); default and cap:
            the source's context length. Past it the cache slides, keeping the document's first tokens as the
            attention sink (`cagkit.kv.prefill.DocumentPrefill`).

    Unchanged files (same content hash, stored chunks matching their checksums, prefilled the same way over the
    same window) are skipped; a file that cannot be read is skipped with a warning and listed in the report. Each document is committed on its own, so an
    interrupted run keeps what it finished and the next run does the rest (a long document it was writing is
    begun again).
    """
    report = IngestReport()
    files = find_documents(paths, skipped=report.failed)  # links in folders that are not read are listed too

    def read_files():
        for file in files:
            try:
                text = read_document(file)
            except DocumentError as exc:
                # stacklevel 4: this generator, _ingest_documents, ingest, then ingest's caller.
                warnings.warn(str(exc), SkippedDocumentWarning, stacklevel=4)
                report.failed.append((str(file), str(exc)))
                continue
            yield document_path(file), text, None

    keep = _still_there if prune else None
    return _ingest_documents(read_files(), report, store, source, chunk_tokens, keep, dtype, progress, device, wait,
                             manifest=manifest, prefill=prefill, window=window)


def _still_there(path: str) -> bool:
    """Whether a stored document's file still exists; an id that is not a file's path (`ingest_texts`) is kept."""
    return not os.path.isabs(path) or os.path.lexists(path)


def ingest_texts(
    items: list[tuple[str, str] | tuple[str, str, dict | None]],
    store: str | Path = DEFAULT_STORE,
    source: str = DEFAULT_SOURCE,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    prune: bool = False,
    dtype: str = "float16",
    progress: bool = True,
    device: str | None = None,
    manifest: str = "sqlite",
    prefill: str = DEFAULT_PREFILL,
    window: int | None = None,
) -> IngestReport:
    """Add in-memory documents to `store`: the same as `ingest`, for text that is not (or not only) in files.

    Args:
        items: `(doc_id, text)` or `(doc_id, text, metadata)` per document. `doc_id` names the document in the
            store (as a file's path does) and must be stable across runs for unchanged documents to be skipped;
            `metadata` (JSON-serialisable) is stored with it and returned with its retrieved chunks.
        store, source, chunk_tokens, dtype, progress, device, manifest, prefill, window: as for `ingest`.
        prune: drop documents from the store whose ids are not among `items`.

    A document is skipped as unchanged when its text and metadata are both unchanged; empty text is skipped with
    a warning and listed in the report's `failed`.
    """
    report = IngestReport()
    docs: dict[str, tuple[str, str, dict | None]] = {}
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) not in (2, 3):
            raise CagkitError(f"ingest_texts item {str(item)[:80]!r} is not (doc_id, text) or (doc_id, text, metadata)")
        doc_id, text, *rest = item
        if not isinstance(doc_id, str) or not doc_id.strip():
            raise CagkitError(f"document id {doc_id!r} is not a non-empty string; give every document a string id "
                              f"such as its file name")
        if not isinstance(text, str):
            raise CagkitError(f"the text of document {doc_id} is a {type(text).__name__}, not a string; pass its text")
        if doc_id in docs:
            raise CagkitError(f"document id {doc_id} appears twice; give every document its own id")
        try:
            # The JSON round trip checks the metadata can be stored and makes it compare equal to what is read back.
            metadata = json.loads(json.dumps(rest[0])) if rest and rest[0] else None
        except (TypeError, ValueError) as exc:
            raise CagkitError(
                f"metadata of document {doc_id} cannot be stored ({exc}); use strings, numbers, booleans, None, "
                f"lists and dicts as values"
            ) from exc
        if not text.strip():
            reason = f"{doc_id}: no text (empty or whitespace only); add content or leave the document out"
            warnings.warn(reason, SkippedDocumentWarning, stacklevel=2)
            report.failed.append((doc_id, reason))
            continue
        docs[doc_id] = (doc_id, text, metadata)
    kept = set(docs) | {doc_id for doc_id, _ in report.failed}
    keep = kept.__contains__ if prune else None
    return _ingest_documents(docs.values(), report, store, source, chunk_tokens, keep, dtype, progress, device,
                             manifest=manifest, prefill=prefill, window=window)


def _ingest_documents(
    docs: Iterable[tuple[str, str, dict | None]],
    report: IngestReport,
    store: str | Path,
    source: str,
    chunk_tokens: int,
    keep: Callable[[str], bool] | None,
    dtype: str,
    progress: bool,
    device: str | None = None,
    wait: bool = False,
    rebuild: set[str] = frozenset(),
    manifest: str = "sqlite",
    prefill: str = DEFAULT_PREFILL,
    window: int | None = None,
) -> IngestReport:
    """Prefill and store each new or changed `(key, text, metadata)`, and those in `rebuild` whatever their state;
    with `keep`, remove stored documents for which it is false.

    An unchanged document is skipped only when its stored chunks match their checksums. A document's chunks are
    prefilled and written in parts of about `PART_TOKENS` tokens, so memory does not grow with its length; it is
    committed once all its parts are written (an interrupted one is begun again by the next run)."""
    check_chunk_tokens(chunk_tokens)
    check_dtype(dtype)  # before the model loads, not at the first write
    check_prefill(prefill, window)
    lm = load_model(source, device)
    reading = DocumentReading.of(lm, chunk_tokens, window) if prefill == "document" else None
    settings = StoreSettings(source=lm.name, source_fingerprint=lm.fingerprint, dtype=dtype,
                             chunk_tokens=chunk_tokens, embedder=EMBEDDER_NAME)
    started = time.perf_counter()
    tables = RotaryTables(lm.model)
    with Store.open_for_writing(store, settings, wait=wait, manifest=manifest) as st:
        report.upgraded = st.upgraded
        report.orphans = st.removed
        todo = []
        for key, text, metadata in docs:
            sha = hashlib.sha256(text.encode()).hexdigest()
            old = st.document(key)
            read_as = (prefill, reading.window if reading is not None else None)
            if (key not in rebuild and old is not None and old.sha256 == sha and old.metadata == (metadata or {})
                    and (old.prefill, old.window) == read_as and st.is_intact(old, checksums=True)):
                report.unchanged.append(key)
                continue
            chunks = chunk_text(text, lm.count_tokens, chunk_tokens, token_ends=_token_ends(lm))
            if reading is not None:
                chunks = reading.tokens(lm, text, chunks)
            todo.append((key, sha, metadata, old is not None, chunks,
                         [len(c.token_ids) if isinstance(c, _ReadChunk) else lm.count_tokens(c.text) for c in chunks]))
        bar = _progress_bar(sum(sum(counts) for *_, counts in todo), lm, progress)
        # a GPU prefills a whole batch in one pass: a part holds at least one batch
        part_budget = max(PART_TOKENS, GPU_BATCH_TOKENS) if lm.device.type == "cuda" else PART_TOKENS
        if reading is not None:
            part_budget = min(part_budget, reading.part_tokens)
        for key, sha, metadata, existed, chunks, counts in todo:
            with st.document_writer(key, sha, metadata) as writer:
                reader = reading.start(lm, tables) if reading is not None else None
                for part, part_tokens in _parts(chunks, counts, part_budget):
                    new = reader.read(part) if reader is not None else prefill_chunks(lm, tables, part)
                    vectors, sentences = embed_with_sentences([c.text for c in new])
                    for chunk, kept in zip(new, sentences):
                        chunk.sentences = kept
                    writer.add(new, vectors)
                    done = sum(len(c.token_ids) for c in new)
                    report.tokens += done
                    del new, vectors, sentences
                    if bar is not None:
                        bar.update(part_tokens)
                        bar.set_postfix(tok_s=f"{report.tokens / (time.perf_counter() - started):.0f}")
                writer.commit()
            (report.updated if existed else report.added).append(key)
            report.chunks += writer.chunks
        if bar is not None:
            bar.close()
        if keep is not None:
            report.removed += st.prune(keep)
    report.seconds = time.perf_counter() - started
    return report


# Source tokens prefilled and written to one KV file at a time: what a long document holds in memory at once
# (with document prefill, beside the window's KV).
PART_TOKENS = 4096


def check_prefill(prefill: str, window: int | None) -> None:
    """Refuse an unknown `--prefill` or a `--window` below one, before any model loads."""
    if prefill not in PREFILL_KINDS:
        raise CagkitError(f"unknown --prefill '{prefill}'; use one of {', '.join(PREFILL_KINDS)}")
    if window is not None and window < 1:
        raise CagkitError(f"--window must be a number of tokens above 0, got {window}")


@dataclass
class _ReadChunk:
    """A chunk with the source tokens the whole document's tokenisation gives it (`DocumentReading.tokens`)."""

    text: str
    char_start: int
    char_end: int
    token_ids: list[int]
    offsets: list[tuple[int, int]]  # char spans within `text`, clipped to it
    position: int  # its first token's index among the document's tokens


@dataclass(frozen=True)
class DocumentReading:
    """How a source reads a document at ingest (`prefill="document"`): after the prompt prefix its questions come
    under (`cagkit.generation.context_prefix`), over a window of `window` tokens."""

    prefix_ids: tuple[int, ...]
    window: int

    @classmethod
    def of(cls, lm, chunk_tokens: int, window: int | None) -> "DocumentReading":
        from cagkit.generation import context_prefix
        from cagkit.models.architecture import context_length

        prefix = tuple(context_prefix(lm))
        limit = context_length(lm.config) or DEFAULT_WINDOW_CAP
        chosen = min(window or limit, limit)
        # a part holds at least two chunks beside the prefix and the sink, whatever tokens a chunk gains from the
        # text between chunks
        least = len(prefix) + SINK_TOKENS + 4 * (chunk_tokens + 8)
        if chosen < least:
            raise CagkitError(f"--window {chosen} is too small for chunks of {chunk_tokens} tokens with {lm.name}; "
                              f"use at least {least}, or smaller --chunk-tokens")
        return cls(prefix, chosen)

    @property
    def part_tokens(self) -> int:
        return max(1, (self.window - len(self.prefix_ids) - SINK_TOKENS) // 2)

    def context(self, position: int) -> tuple[int, int, int, int]:
        """A chunk's `NewChunk.context`: where it starts in the document, the prefix, the window and the sink."""
        return (position, len(self.prefix_ids), self.window, SINK_TOKENS)

    def tokens(self, lm, text: str, chunks: list[Chunk]) -> list[_ReadChunk]:
        """`chunks` with the tokens of the whole `text` tokenised at once, each token given to the chunk that holds
        its first non-blank character (a blank token to the chunk before it), so the chunks' tokens together are
        exactly the document's and the text between chunks is read too. Where that leaves a chunk without
        tokens (a token across a cut inside a word), each chunk's own tokens instead."""
        import bisect

        enc = lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        starts = [c.char_start for c in chunks]
        owned: list[list[int]] = [[] for _ in chunks]
        for i, (a, b) in enumerate(enc["offset_mapping"]):
            piece = text[a:b]
            first = a + (len(piece) - len(piece.lstrip())) if piece.strip() else a
            owned[max(0, bisect.bisect_right(starts, first) - 1)].append(i)
        ids, spans = enc["input_ids"], enc["offset_mapping"]
        if any(not o for o in owned):
            own = [lm.tokenizer(c.text, add_special_tokens=False, return_offsets_mapping=True) for c in chunks]
            pieces = [(e["input_ids"], [tuple(o) for o in e["offset_mapping"]]) for e in own]
        else:
            pieces = []
            for c, o in zip(chunks, owned):
                n = len(c.text)
                pieces.append(([ids[i] for i in o],
                               [(min(max(spans[i][0] - c.char_start, 0), n), min(max(spans[i][1] - c.char_start, 0), n))
                                for i in o]))
        out, position = [], 0
        for c, (chunk_ids, offsets) in zip(chunks, pieces):
            out.append(_ReadChunk(c.text, c.char_start, c.char_end, chunk_ids, offsets, position))
            position += len(chunk_ids)
        return out

    def start(self, lm, tables) -> "_DocumentReader":
        return _DocumentReader(self, DocumentPrefill(lm.model, list(self.prefix_ids), self.window, tables))


# The window when a model's config names no context length.
DEFAULT_WINDOW_CAP = 32768


@dataclass
class _DocumentReader:
    """One document being read: each part's chunks prefilled in one pass after everything before them."""

    reading: DocumentReading
    prefill: DocumentPrefill

    def read(self, part: list[_ReadChunk]) -> list[NewChunk]:
        from cagkit.kv.chunk import ChunkKV

        ids = [t for c in part for t in c.token_ids]
        kv = self.prefill.add(ids)
        out, at = [], 0
        for c in part:
            n = len(c.token_ids)
            out.append(NewChunk(text=c.text, char_start=c.char_start, char_end=c.char_end, token_ids=c.token_ids,
                                offsets=c.offsets, kv=ChunkKV(kv.keys[:, at:at + n], kv.values[:, at:at + n]),
                                context=self.reading.context(c.position)))
            at += n
        return out


def _token_ends(lm) -> Callable[[str], list[int]]:
    """Where each of `lm`'s tokens of a string ends (a character offset), for cutting text at token boundaries."""
    def ends(text: str) -> list[int]:
        return [end for _, end in lm.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]

    return ends


def _parts(chunks: list[Chunk], counts: list[int], budget: int) -> Iterable[tuple[list[Chunk], int]]:
    """Consecutive runs of `chunks` of at most `budget` tokens together (at least one chunk each), with their
    token counts."""
    part, total = [], 0
    for chunk, count in zip(chunks, counts):
        if part and total + count > budget:
            yield part, total
            part, total = [], 0
        part.append(chunk)
        total += count
    if part:
        yield part, total


# Tokens prefilled in one forward pass on a GPU; on the CPU one chunk at a time (batching saves nothing there).
GPU_BATCH_TOKENS = 16384


def prefill_chunks(lm, tables, chunks, batch_tokens: int | None = None, encoded: list | None = None) -> list[NewChunk]:
    """Tokenise and prefill `chunks` (from `chunk_text`) with the source model, up to `batch_tokens` tokens in one
    forward pass (default: `GPU_BATCH_TOKENS` on a GPU, 0 = one chunk at a time on the CPU). `encoded`: the
    chunks' tokenizer outputs (ids and offsets), where the caller has them already."""
    chunks = list(chunks)
    if encoded is None:
        encoded = [lm.tokenizer(c.text, add_special_tokens=False, return_offsets_mapping=True) for c in chunks]
    budget = batch_tokens if batch_tokens is not None else GPU_BATCH_TOKENS if lm.device.type == "cuda" else 0
    kvs, batch = [], []
    for enc in encoded + [None]:  # None flushes the last batch
        if batch and (enc is None or sum(map(len, batch)) + len(enc["input_ids"]) > budget):
            kvs += prefill_kv_batch(lm.model, batch, tables)
            batch = []
        if enc is not None:
            batch.append(enc["input_ids"])
    return [NewChunk(text=c.text, char_start=c.char_start, char_end=c.char_end, token_ids=enc["input_ids"],
                     offsets=[tuple(o) for o in enc["offset_mapping"]], kv=kv)
            for c, enc, kv in zip(chunks, encoded, kvs, strict=True)]


def _progress_bar(tokens: int, lm, enabled: bool):
    """A bar of the source tokens to prefill, moved as each part of a document is written."""
    if not enabled or not tokens:
        return None
    from tqdm import tqdm

    return tqdm(total=tokens, unit="tok", unit_scale=True, desc=f"prefill ({lm.name})", file=sys.stderr)


def remove(paths: list[str | Path], store: str | Path = DEFAULT_STORE) -> list[str]:
    """Drop documents from `store` without ingesting anything: each of `paths` is a document as stored (its
    resolved file path, or the id given to `ingest_texts`) or a folder, which drops every document under it.
    Returns the stored paths removed.

    Nothing is removed unless every path matches a stored document, so a typo never half-applies; the error
    names the paths that matched nothing.
    """
    with Store.open(store) as st:
        settings = st.settings
    with Store.open_for_writing(store, settings) as st:
        stored = [doc.path for doc in st.documents()]
        chosen, unmatched = [], []
        for given in paths:
            as_file = str(Path(given).expanduser().resolve())  # a folder, or a file stored under its target
            found = [p for p in stored if p in (str(given), as_file, document_path(given))
                     or p.startswith(as_file.rstrip("/") + "/")]
            (chosen.extend(found) if found else unmatched.append(str(given)))
        if unmatched:
            raise CagkitError(f"no document in store {store} is or lies under {', '.join(unmatched)}; "
                              f"`cagkit store info --store {store}` lists what it holds")
        chosen = list(dict.fromkeys(chosen))
        for path in chosen:
            st.remove_document(path)
    return chosen


def repair(store: str | Path = DEFAULT_STORE, progress: bool = True, device: str | None = None,
           wait: bool = False, prefill: str = DEFAULT_PREFILL, window: int | None = None) -> tuple[dict, IngestReport]:
    """Rebuild what `Store.verify` finds damaged: each damaged document whose source file still exists is ingested
    again (with the store's own source model and settings), and the KV files cagkit wrote that no document uses
    are removed. Returns the verification before the repair and the ingest's report: `updated` the rebuilt
    documents, `orphans` the files removed, `failed` the damaged documents that could not be rebuilt (their
    files are gone, or they were given as text) with what to do.

    A damaged manifest cannot be rebuilt from the KV files: that is a StoreError naming what to do."""
    with Store.open(store) as st:
        found = st.verify()
        settings = st.settings
    if found["manifest"] != "ok":
        raise DamagedManifestError(f"store manifest {Path(store) / 'manifest.sqlite'} is damaged ({found['manifest']}); "
                                   f"repair cannot rebuild it: move the store aside and re-run `cagkit ingest DOCS "
                                   f"--store {store}`")
    report = IngestReport()
    texts = []
    for path in found["damaged"]:
        if not (os.path.isabs(path) and os.path.isfile(path)):
            report.failed.append((path, f"damaged and its source is not a file here; ingest it again, or drop it with "
                                        f"`cagkit store remove {path} --store {store}`"))
            continue
        try:
            texts.append((path, read_document(Path(path)), None))
        except DocumentError as exc:
            report.failed.append((path, str(exc)))
    if not texts:  # nothing to prefill: opening for writing removes the orphans, and no model is needed
        with Store.open_for_writing(store, settings, wait=wait) as st:
            report.orphans = st.removed
        return found, report
    _ingest_documents(texts, report, store, settings.source, settings.chunk_tokens, None, settings.dtype, progress,
                      device, wait, rebuild={path for path, _, _ in texts}, prefill=prefill, window=window)
    return found, report
