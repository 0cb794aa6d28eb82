"""The persistent KV store: one safetensors file per document, an SQLite manifest for everything else.

Layout of a store directory:

    manifest.sqlite     settings (format version, source model and fingerprint, dtype, chunking),
                        documents (path, content hash, KV file, metadata) and chunks (text, offsets, embedding)
    kv/<hash>.safetensors   per chunk i: `{i}.keys`, `{i}.values` [L, T, H, D] RoPE-free,
                        `{i}.token_ids` [T] int32, `{i}.offsets` [T, 2] int32 (char spans in the chunk text),
                        `{i}.sentences` [S, 2] int32 char spans of the chunk's sentences with
                        `{i}.sentence_embeddings` [S, E] float16 (absent only where written without an embedder)

The format changes by numbered migrations (`cagkit.store.migrations`), applied when a store is opened.

Writes are crash-safe: a document's KV file is written under a temporary name and renamed into place, and only
then is it recorded in the manifest, in one transaction. An interrupted ingest leaves the manifest pointing at
complete files only; stray files from it are removed the next time the store is opened for writing.
"""

from __future__ import annotations

import fcntl
import json
import sqlite3
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np
from safetensors import safe_open

from cagkit.config import KV_DTYPES
from cagkit.errors import StoreError
from cagkit.files import save_safetensors
from cagkit.store import migrations

if TYPE_CHECKING:  # PyTorch is imported where KV is read or written, so `cagkit store info` starts at once
    import torch

    from cagkit.kv.chunk import ChunkKV

FORMAT_VERSION = 1
_CHUNK_TENSORS = ("keys", "values", "token_ids", "offsets")  # every chunk has these; sentences need an embedder


@dataclass(frozen=True)
class StoreSettings:
    """What a store was built with; all of it must match to add to the store."""

    source: str  # the source model's name, for people and translator lookup
    source_fingerprint: str
    dtype: str
    chunk_tokens: int
    embedder: str
    format_version: int = FORMAT_VERSION


@dataclass(frozen=True)
class Document:
    id: int
    path: str
    sha256: str
    kv_file: str
    n_chunks: int
    n_tokens: int
    metadata: dict = field(default_factory=dict)  # the caller's, e.g. a LlamaIndex Document's metadata


@dataclass(frozen=True)
class Hit:
    """A retrieved chunk."""

    chunk_id: int
    doc_path: str
    idx: int
    text: str
    score: float
    metadata: dict = field(default_factory=dict)  # its document's metadata


@dataclass
class _SearchIndex:
    """Every chunk of a store as `Store.search` ranks it, in chunk-id order."""

    ids: np.ndarray  # [N] chunk ids
    embeddings: np.ndarray  # [N, E] unit chunk embeddings
    paths: np.ndarray  # [N] each chunk's document path (or id)
    texts: list[str] | None = None  # read on the first lexical or hybrid search, which needs them
    lexical: object = None  # the `cagkit.retrieval.LexicalIndex` of `texts`, built on the first such search


@dataclass
class StoredChunk:
    """A chunk's text and its source-model KV, as loaded from the store."""

    chunk_id: int
    doc_path: str
    idx: int
    text: str
    token_ids: list[int]
    offsets: torch.Tensor  # [T, 2] char spans of each source token in `text`
    kv: ChunkKV
    # its sentences' char spans [S, 2] and unit embeddings [S, E]; None in a store written without an embedder
    sentences: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class NewChunk:
    """A chunk ready to be written: its text, where it sits in the document, and its KV."""

    text: str
    char_start: int
    char_end: int
    token_ids: list[int]
    offsets: list[tuple[int, int]]
    kv: ChunkKV
    sentences: tuple[np.ndarray, np.ndarray] | None = None  # sentence char spans [S, 2], embeddings [S, E]


class Store:
    """A directory of stored chunk KV caches. Open with `Store.open` (read) or `Store.open_for_writing`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, settings: StoreSettings):
        self.path = path
        self._conn = conn
        self.settings = settings
        self._index: _SearchIndex | None = None  # what search ranks, read from the manifest on first use
        self._lock = None  # held while open for writing, so two ingests never interleave
        self.upgraded: list[str] = []  # documents whose KV files migrations rewrote as this opened the store

    # -- opening -------------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path) -> "Store":
        """Open an existing store for reading; a missing or foreign directory is a StoreError."""
        path = Path(path)
        manifest = path / "manifest.sqlite"
        if not manifest.exists():
            raise StoreError(f"no cagkit store at {path} (no manifest.sqlite); create one with `cagkit ingest DOCS --store {path}`")
        conn = _connect(manifest)
        _migrate_for_reading(path, conn)
        settings = _read_settings(conn, manifest)
        if settings is None:
            raise StoreError(f"store {path} has no settings yet (an ingest is creating it, or was interrupted before its first document); run `cagkit ingest DOCS --store {path}`")
        return cls(path, conn, settings)

    @classmethod
    def open_for_writing(cls, path: str | Path, settings: StoreSettings, wait: bool = False) -> "Store":
        """Create the store, or open it after checking it was built with the same `settings`. While another
        process writes it: a `StoreError`, or with `wait` a wait until that process is done."""
        path = Path(path)
        (path / "kv").mkdir(parents=True, exist_ok=True)
        lock = _lock_for_writing(path, wait)
        manifest = path / "manifest.sqlite"
        conn = _connect(manifest)
        upgraded = migrations.apply(conn, path)
        existing = _read_settings(conn, manifest)
        if existing is None:
            with conn:
                conn.executemany(
                    "INSERT OR REPLACE INTO settings VALUES (?, ?)",
                    [(k, json.dumps(v)) for k, v in settings.__dict__.items()],
                )
        else:
            _check_compatible(path, existing, settings)
        store = cls(path, conn, existing or settings)
        store._lock = lock
        store.upgraded = upgraded
        store._remove_strays()
        return store

    def close(self) -> None:
        self._conn.close()
        if self._lock is not None:
            self._lock.close()  # releases the writer's lock

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- documents -----------------------------------------------------------------------------------------

    def documents(self) -> list[Document]:
        rows = self._conn.execute(
            "SELECT id, path, sha256, kv_file, n_chunks, n_tokens, metadata FROM documents ORDER BY path"
        ).fetchall()
        return [Document(*row[:-1], _metadata(row[-1])) for row in rows]

    def document(self, path: str) -> Document | None:
        row = self._conn.execute(
            "SELECT id, path, sha256, kv_file, n_chunks, n_tokens, metadata FROM documents WHERE path = ?", (path,)
        ).fetchone()
        return Document(*row[:-1], _metadata(row[-1])) if row else None

    def num_chunks(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]

    def is_intact(self, doc: Document) -> bool:
        """True when the document's KV file opens and holds every chunk the manifest lists."""
        names = self._kv_names(doc)
        return names is not None and all(f"{i}.{t}" in names for i in range(doc.n_chunks) for t in _CHUNK_TENSORS)

    def _kv_names(self, doc: Document) -> set[str] | None:
        """The tensor names in `doc`'s KV file, or None when it does not open (any failure to parse means the
        file cannot be trusted)."""
        try:  # numpy: listing names reads no tensor, and the "pt" framework would import PyTorch
            with safe_open(self.path / "kv" / doc.kv_file, framework="numpy") as f:
                return set(f.keys())
        except Exception:
            return None

    def write_document(
        self, path: str, sha256: str, chunks: list[NewChunk], embeddings: np.ndarray, metadata: dict | None = None
    ) -> None:
        """Add or replace one document: its KV file first (atomic rename), then its manifest rows (one transaction).

        `metadata` (JSON-serialisable) is kept with the document and returned with every Hit of its chunks.
        """
        import torch

        dtype = getattr(torch, check_dtype(self.settings.dtype))
        tensors: dict[str, torch.Tensor] = {}
        for i, c in enumerate(chunks):
            tensors[f"{i}.keys"] = c.kv.keys.to(device="cpu", dtype=dtype).contiguous()  # [L, T, H, D]
            tensors[f"{i}.values"] = c.kv.values.to(device="cpu", dtype=dtype).contiguous()
            tensors[f"{i}.token_ids"] = torch.tensor(c.token_ids, dtype=torch.int32)  # [T]
            tensors[f"{i}.offsets"] = torch.tensor(c.offsets, dtype=torch.int32).reshape(-1, 2)  # [T, 2]
            if c.sentences is not None:
                tensors.update(migrations.sentence_tensors(i, c.sentences))
        kv_file = f"{sha256[:24]}.safetensors"
        final = self.path / "kv" / kv_file
        meta = {"format_version": str(FORMAT_VERSION), "source_fingerprint": self.settings.source_fingerprint,
                "dtype": self.settings.dtype, "document": path}
        save_safetensors(tensors, final, metadata=meta)

        old = self.document(path)
        with self._conn:
            if old is not None:
                self._conn.execute("DELETE FROM chunks WHERE doc_id = ?", (old.id,))
                self._conn.execute("DELETE FROM documents WHERE id = ?", (old.id,))
            cur = self._conn.execute(
                "INSERT INTO documents (path, sha256, kv_file, n_chunks, n_tokens, ingested_at, metadata) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (path, sha256, kv_file, len(chunks), sum(len(c.token_ids) for c in chunks), time.time(),
                 json.dumps(metadata) if metadata else None),
            )
            self._conn.executemany(
                "INSERT INTO chunks (doc_id, idx, text, char_start, char_end, n_tokens, embedding) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (cur.lastrowid, i, c.text, c.char_start, c.char_end, len(c.token_ids), embeddings[i].astype(np.float32).tobytes())
                    for i, c in enumerate(chunks)
                ],
            )
        if old is not None and old.kv_file != kv_file:
            (self.path / "kv" / old.kv_file).unlink(missing_ok=True)
        self._index = None

    def remove_document(self, path: str) -> None:
        """Drop one document: its manifest rows first (one transaction), then its KV file; unknown paths are a
        no-op."""
        old = self.document(path)
        if old is None:
            return
        with self._conn:
            self._conn.execute("DELETE FROM chunks WHERE doc_id = ?", (old.id,))
            self._conn.execute("DELETE FROM documents WHERE id = ?", (old.id,))
        if not self._conn.execute("SELECT 1 FROM documents WHERE kv_file = ?", (old.kv_file,)).fetchone():
            (self.path / "kv" / old.kv_file).unlink(missing_ok=True)
        self._index = None

    def summary(self) -> dict:
        """What the store holds, for people and scripts (`cagkit store info`): its settings, totals and, per
        document, chunks, tokens, KV bytes on disk and state: `ok` or `damaged` (re-ingest it)."""
        documents = []
        for doc in self.documents():
            file = self.path / "kv" / doc.kv_file
            state = "ok" if self.is_intact(doc) else "damaged"
            documents.append({"path": doc.path, "chunks": doc.n_chunks, "tokens": doc.n_tokens,
                              "kv_bytes": file.stat().st_size if file.exists() else 0, "state": state,
                              "metadata": doc.metadata})
        manifest = self.path / "manifest.sqlite"
        return {
            "store": str(self.path), "settings": dict(self.settings.__dict__),
            "documents": len(documents), "chunks": sum(d["chunks"] for d in documents),
            "tokens": sum(d["tokens"] for d in documents),
            "bytes": sum(d["kv_bytes"] for d in documents) + (manifest.stat().st_size if manifest.exists() else 0),
            "per_document": documents,
        }

    # -- retrieval and loading -----------------------------------------------------------------------------

    def search(self, query: np.ndarray, top_k: int, text: str | None = None, retrieval: str = "dense",
               documents: Iterable[str] | None = None) -> list[Hit]:
        """The `top_k` chunks best for a question, best first.

        `query` is the question's unit-normalised embedding [E] and `text` the question itself, which `lexical`
        and `hybrid` retrieval need (`cagkit.retrieval`); `dense` ranks by the embedding alone. With
        `documents` (paths or ids as stored) only their chunks are candidates, ranked as in a store that held
        only them: BM25's word statistics are theirs too (`cagkit eval`, where each question has its own
        documents in one shared store). Each hit's `score` is the one it was ranked by.
        """
        from cagkit.retrieval.lexical import LexicalIndex
        from cagkit.retrieval.rank import rank  # rank refuses an unknown retrieval

        if self._index is None:
            rows = self._conn.execute(
                "SELECT c.id, c.embedding, d.path FROM chunks c JOIN documents d ON d.id = c.doc_id ORDER BY c.id"
            ).fetchall()
            self._index = _SearchIndex(
                np.array([r[0] for r in rows], dtype=np.int64),
                np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows]) if rows else np.zeros((0, 0), np.float32),
                np.array([r[2] for r in rows], dtype=object))
        index = self._index
        if len(index.ids) == 0:
            raise StoreError(f"store {self.path} holds no documents; add some with `cagkit ingest DOCS --store {self.path}`")
        candidates = np.arange(len(index.ids))
        if documents is not None:
            candidates = np.flatnonzero(np.isin(index.paths, list(documents)))
        dense = index.embeddings[candidates] @ query.astype(np.float32)  # [C]
        lexical = None
        if retrieval != "dense" and text is not None:
            if index.texts is None:  # by id: an ingest may have written to the store since the ids were read
                text_of = dict(self._conn.execute("SELECT id, text FROM chunks").fetchall())
                index.texts = [text_of.get(int(i), "") for i in index.ids]
            if documents is not None:  # a few documents' chunks: their own statistics, built for this search
                lexical = LexicalIndex([index.texts[i] for i in candidates]).scores(text)
            else:
                if index.lexical is None:
                    index.lexical = LexicalIndex(index.texts)  # built once per open store, on the first search
                lexical = index.lexical.scores(text)
        best, scores = rank(dense, lexical, retrieval, top_k)
        hits = []
        for i, score in zip(candidates[best], scores):
            row = self._conn.execute(
                "SELECT d.path, c.idx, c.text, d.metadata FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE c.id = ?",
                (int(index.ids[i]),),
            ).fetchone()
            hits.append(Hit(int(index.ids[i]), row[0], row[1], row[2], float(score), _metadata(row[3])))
        return hits

    def chunk_ids(self, path: str) -> list[int]:
        """All chunk ids of one document, in document order."""
        doc = self.document(path)
        if doc is None:
            raise StoreError(f"document {path} is not in store {self.path}")
        return [r[0] for r in self._conn.execute("SELECT id FROM chunks WHERE doc_id = ? ORDER BY idx", (doc.id,))]

    def load_chunk(self, chunk_id: int) -> StoredChunk:
        """A chunk's text and KV; the KV file is memory-mapped, so only this chunk's tensors are read."""
        row = self._conn.execute(
            "SELECT d.path, d.kv_file, c.idx, c.text FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE c.id = ?",
            (chunk_id,),
        ).fetchone()
        if row is None:
            raise StoreError(f"chunk {chunk_id} is not in store {self.path}")
        from cagkit.kv.chunk import ChunkKV

        doc_path, kv_file, idx, text = row
        file = self.path / "kv" / kv_file
        try:
            with safe_open(file, framework="pt") as f:
                kv = ChunkKV(f.get_tensor(f"{idx}.keys"), f.get_tensor(f"{idx}.values"))
                token_ids = f.get_tensor(f"{idx}.token_ids").tolist()
                offsets = f.get_tensor(f"{idx}.offsets")
                sentences = None
                if f"{idx}.sentences" in f.keys():
                    sentences = (f.get_tensor(f"{idx}.sentences").numpy(),
                                 f.get_tensor(f"{idx}.sentence_embeddings").float().numpy())
        except Exception as exc:  # safetensors raises several types for damaged files
            raise StoreError(
                f"KV file {file} (document {doc_path}) is damaged or missing ({type(exc).__name__}); "
                f"run `cagkit ingest {doc_path} --store {self.path}` to rebuild it"
            ) from exc
        return StoredChunk(chunk_id, doc_path, idx, text, token_ids, offsets, kv, sentences)

    # -- housekeeping --------------------------------------------------------------------------------------

    def _remove_strays(self) -> None:
        """Delete temporary files and KV files the manifest does not list (left by an interrupted ingest)."""
        listed = {r[0] for r in self._conn.execute("SELECT kv_file FROM documents")}
        for file in (self.path / "kv").iterdir():
            if file.name not in listed:
                file.unlink(missing_ok=True)


def check_dtype(dtype: str) -> str:
    """`dtype` if a store can hold KV in it, else a StoreError that lists the ones it can."""
    if dtype not in KV_DTYPES:
        raise StoreError(f"KV dtype {dtype!r} is not one a store holds; use one of {', '.join(KV_DTYPES)}")
    return dtype


def _metadata(column: str | None) -> dict:
    return json.loads(column) if column else {}


def _lock_for_writing(path: Path, wait: bool = False):
    """An exclusive lock on the store; a second writer gets a clear error instead of racing the first, or with
    `wait` blocks until the first is done."""
    handle = _try_lock(path)
    if handle is None:
        if not wait:
            raise StoreError(f"store {path} is being written by another cagkit ingest; wait for it to finish")
        print(f"store {path} is being written by another cagkit process; waiting for it", file=sys.stderr, flush=True)
        handle = open(path / "write.lock", "w")
        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _try_lock(path: Path):
    """The store's writer lock if no other process holds it, else None."""
    try:
        handle = open(path / "write.lock", "w")
    except OSError as exc:
        raise StoreError(f"cannot write to store {path} ({exc.strerror}); give yourself write access to it or use "
                         f"another --store") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _migrate_for_reading(path: Path, conn: sqlite3.Connection) -> None:
    """Bring a store opened for reading to the current format. Migrating writes, so it takes the writer lock;
    while a writer holds it, that writer migrates the store as it opens it, and this waits for that."""
    while migrations.pending(conn, path):
        lock = _try_lock(path)
        if lock is None:
            time.sleep(0.1)
            continue
        try:
            migrations.apply(conn, path)
        finally:
            lock.close()


def _connect(manifest: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(manifest)
        conn.execute("PRAGMA foreign_keys = ON")
        migrations.pending(conn, manifest.parent)  # reads the manifest: a damaged one fails here, not later
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"store manifest {manifest} is damaged ({exc}); move the store aside and re-run `cagkit ingest`"
        ) from exc
    return conn


def _read_settings(conn: sqlite3.Connection, manifest: Path) -> StoreSettings | None:
    try:
        rows = dict(conn.execute("SELECT key, value FROM settings").fetchall())
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"store manifest {manifest} is damaged ({exc}); move the store aside and re-run `cagkit ingest`") from exc
    if not rows:
        return None
    values = {k: json.loads(v) for k, v in rows.items()}
    if values.get("format_version") != FORMAT_VERSION:
        raise StoreError(
            f"store {manifest.parent} has format version {values.get('format_version')}, this cagkit reads "
            f"{FORMAT_VERSION}; ingest the documents into a new store"
        )
    return StoreSettings(**values)


def _check_compatible(path: Path, have: StoreSettings, want: StoreSettings) -> None:
    if have.source_fingerprint != want.source_fingerprint:
        raise StoreError(
            f"store {path} was built with source model '{have.source}' (fingerprint {have.source_fingerprint}), "
            f"not '{want.source}' ({want.source_fingerprint}); use `--source {have.source}` or another --store"
        )
    for name in ("dtype", "chunk_tokens", "embedder"):
        if getattr(have, name) != getattr(want, name):
            raise StoreError(
                f"store {path} was built with {name}={getattr(have, name)}, not {getattr(want, name)}; "
                f"use the same setting or another --store"
            )
