"""`cagkit ingest`: read documents, chunk them, prefill each chunk once with the source model, store the KV."""

from __future__ import annotations

import hashlib
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from cagkit.documents import chunk_text, find_documents, read_document
from cagkit.embeddings import EMBEDDER_NAME, embed
from cagkit.errors import DocumentError, SkippedDocumentWarning
from cagkit.kvcache import prefill_kv
from cagkit.models import load_model
from cagkit.rope import RotaryTables
from cagkit.store import DEFAULT_STORE, NewChunk, Store, StoreSettings

# 256 source tokens keeps a chunk, once translated, well inside Gemma 3's 512-token sliding window.
DEFAULT_CHUNK_TOKENS = 256
DEFAULT_SOURCE = "smollm2"


@dataclass
class IngestReport:
    """What one ingest run did."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
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
) -> IngestReport:
    """Add the documents under `paths` to `store`, prefilling each new or changed one with `source`.

    Args:
        paths: files and folders (searched recursively for .txt, .md, .rst, .html, .pdf).
        store: the store directory; created on first use.
        source: the model that prefills the chunks (alias, Hugging Face id or model directory).
        chunk_tokens: the most source tokens in one chunk.
        prune: drop documents from the store whose files are no longer under `paths`.
        dtype: how KV is stored: float16 (default), bfloat16 or float32.
        progress: draw a progress bar on stderr.

    Unchanged files (same content hash, intact KV file) are skipped; a file that cannot be read is skipped with
    a warning and listed in the report. Each document is committed on its own, so an interrupted run keeps what
    it finished and the next run does the rest.
    """
    if chunk_tokens < 16:
        raise ValueError(f"--chunk-tokens must be at least 16, got {chunk_tokens}")
    files = find_documents(paths)
    lm = load_model(source)
    settings = StoreSettings(source=lm.name, source_fingerprint=lm.fingerprint, dtype=dtype,
                             chunk_tokens=chunk_tokens, embedder=EMBEDDER_NAME)
    report = IngestReport()
    started = time.perf_counter()
    tables = RotaryTables(lm.model)
    with Store.open_for_writing(store, settings) as st:
        todo = []
        for file in files:
            key = str(file.resolve())
            try:
                text = read_document(file)
            except DocumentError as exc:
                warnings.warn(str(exc), SkippedDocumentWarning, stacklevel=2)
                report.failed.append((str(file), str(exc)))
                continue
            sha = hashlib.sha256(text.encode()).hexdigest()
            old = st.document(key)
            if old is not None and old.sha256 == sha and st.is_intact(old):
                report.unchanged.append(key)
                continue
            todo.append((key, text, sha, old is not None))
        bar = _progress_bar(todo, lm, progress)
        for key, text, sha, existed in todo:
            chunks = [_prefill_chunk(lm, tables, c) for c in chunk_text(text, lm.count_tokens, chunk_tokens)]
            st.write_document(key, sha, chunks, embed([c.text for c in chunks]))
            (report.updated if existed else report.added).append(key)
            report.chunks += len(chunks)
            report.tokens += sum(len(c.token_ids) for c in chunks)
            if bar is not None:
                bar.update(len(text))
                bar.set_postfix(tok_s=f"{report.tokens / (time.perf_counter() - started):.0f}")
        if bar is not None:
            bar.close()
        if prune:
            keep = {str(f.resolve()) for f in files}
            for doc in st.documents():
                if doc.path not in keep:
                    st.remove_document(doc.path)
                    report.removed.append(doc.path)
    report.seconds = time.perf_counter() - started
    return report


def _prefill_chunk(lm, tables, chunk) -> NewChunk:
    encoded = lm.tokenizer(chunk.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    return NewChunk(
        text=chunk.text,
        char_start=chunk.char_start,
        char_end=chunk.char_end,
        token_ids=ids,
        offsets=[tuple(o) for o in encoded["offset_mapping"]],
        kv=prefill_kv(lm.model, ids, tables),
    )


def _progress_bar(todo, lm, enabled):
    if not enabled or not todo:
        return None
    from tqdm import tqdm

    total = sum(len(text) for _, text, _, _ in todo)
    return tqdm(total=total, unit="char", unit_scale=True, desc=f"prefill ({lm.name})", file=sys.stderr)
