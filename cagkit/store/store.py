"""The SQLite kind of store (`SQLiteStore`, the default): safetensors files of chunk KV, an SQLite manifest for
everything else. What it shares with the LanceDB kind (`cagkit.store.lance`) lives in `cagkit.store.base` (the
`Store` interface, `open_store`, chunks and their checks); those names are importable from here as well.

Layout of a store directory:

    manifest.sqlite     settings (format version, source model and fingerprint, dtype, chunking),
                        documents (path, content hash, metadata), chunks (text, offsets, embedding, the KV file
                        that holds the chunk and the checksum of its tensors) and kv_files (every KV file
                        cagkit wrote into kv/, recorded before it is written)
    kv/<hash>-<write>.<part>.safetensors   per chunk i: `{i}.keys`, `{i}.values` [L, T, H, D] RoPE-free,
                        `{i}.token_ids` [T] int32, `{i}.offsets` [T, 2] int32 (char spans in the chunk text),
                        `{i}.sentences` [S, 2] int32 char spans of the chunk's sentences with
                        `{i}.sentence_embeddings` [S, E] float16 (absent only where written without an embedder),
                        `{i}.context` [4] int32 where the document was prefilled whole (`cagkit.kv.prefill.
                        DocumentPrefill`): the chunk's first token's index among the document's tokens, the prompt
                        prefix's length, the window and the sink; absent where the chunk was prefilled alone

A document's chunks are written in parts of a few thousand tokens, one file each, as they are prefilled, so a
book needs no more memory than a page. Every write of a document gets files of its own, never shared with
another document or another version of it. The manifest itself marks the folder as a store: cagkit adds to a
folder only when it holds a manifest or is new or empty, and deletes only KV files it recorded in `kv_files` (and
the temporaries of those), never anything else in the folder.

The format changes by numbered migrations (`cagkit.store.migrations`), applied when a store is opened.

Writes are crash-safe: each KV file is written under a temporary name and renamed into place, and only once all
of a document's files are complete is it recorded in the manifest, in one transaction. An interrupted ingest
leaves the manifest pointing at complete files only; the files it had begun are removed the next time the store
is opened for writing. Each chunk's checksum is verified as it is loaded (`load_chunk`) and by `verify`.
"""

from __future__ import annotations

import fcntl
import functools
import json
import re
import secrets
import sqlite3
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from cagkit.errors import StoreError
from cagkit.files import is_temporary, save_safetensors
from cagkit.store import migrations
from cagkit.store.base import (  # noqa: F401 - the shared names, also importable from here as they always were
    CHUNK_TENSORS,
    FORMAT_VERSION,
    MANIFESTS,
    BaseDocumentWriter,
    ChunkGoneError,
    DamagedChunkError,
    DamagedManifestError,
    Document,
    Hit,
    NewChunk,
    Store,
    StoreBusyError,
    StoredChunk,
    StoreSettings,
    check_compatible,
    check_dtype,
    check_location,
    check_store_folder,
    chunk_gone,
    chunk_problems,
    chunk_tensors,
    is_store,
    is_url,
    no_documents,
    open_store,
    rank_chunks,
    read_chunk,
    read_chunks,
    settings_from,
    summary_of,
)
from cagkit.store.kvfile import DamagedFile, KVFile, chunk_checksums, to_torch


@dataclass
class _SearchIndex:
    """Every chunk of a store as `Store.search` ranks it, in chunk-id order."""

    ids: np.ndarray  # [N] chunk ids
    embeddings: np.ndarray  # [N, E] unit chunk embeddings
    paths: np.ndarray  # [N] each chunk's document path (or id)
    texts: list[str] | None = None  # read on the first lexical or hybrid search, which needs them
    lexical: object = None  # the `cagkit.retrieval.LexicalIndex` of `texts`, built on the first such search


class SQLiteStore(Store):
    """A local directory of stored chunk KV caches with an SQLite manifest (the module's docstring)."""

    kind = "sqlite"

    def __init__(self, path: Path, conn: sqlite3.Connection, settings: StoreSettings):
        self.path = path
        self._conn = conn
        self.settings = settings
        self._index: _SearchIndex | None = None  # what search ranks, read from the manifest on first use
        self._lock = None  # held while open for writing, so two ingests never interleave
        self.upgraded: list[str] = []  # documents whose KV files migrations rewrote as this opened the store
        self.removed: list[str] = []  # leftover KV files of cagkit's own removed as this opened it for writing

    # -- opening -------------------------------------------------------------------------------------------

    @classmethod
    def is_at(cls, location: str | Path) -> bool:
        return not is_url(location) and (Path(location) / "manifest.sqlite").exists()

    @classmethod
    def check_folder(cls, path: Path) -> None:
        """Refuse a --store that is a file, or a folder with other things in it that is not a store (a writer
        that was interrupted before its first commit leaves an empty kv/ and its lock)."""
        check_store_folder(path, "manifest.sqlite", own=("kv", "write.lock"))

    @classmethod
    def open(cls, path: str | Path) -> "SQLiteStore":
        """Open an existing store for reading; a missing or foreign directory is a StoreError."""
        path = Path(path)
        manifest = path / "manifest.sqlite"
        if path.exists() and not path.is_dir():
            raise StoreError(f"store {path} is a file, not a store folder; give the folder of a cagkit store as --store")
        if not manifest.exists():
            raise StoreError(f"no cagkit store at {path} (no manifest.sqlite); create one with `cagkit ingest DOCS --store {path}`")
        conn = _connect(manifest)
        _migrate_for_reading(path, conn)
        settings = _read_settings(conn, manifest)
        if settings is None:
            raise StoreError(f"store {path} has no settings yet (an ingest is creating it, or was interrupted before its first document); run `cagkit ingest DOCS --store {path}`")
        return cls(path, conn, settings)

    @classmethod
    def open_for_writing(cls, path: str | Path, settings: StoreSettings, wait: bool = False) -> "SQLiteStore":
        """Create the store, or open it after checking it was built with the same `settings`. While another
        process writes it: a `StoreError`, or with `wait` a wait until that process is done.

        A folder that is neither a store (it has no manifest) nor new or empty is refused: cagkit writes only into
        folders that are its own."""
        path = Path(path)
        cls.check_folder(path)
        try:
            (path / "kv").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _write_error(path, exc) from None
        _check_writable(path)
        lock = _lock_for_writing(path, wait)
        conn = None
        try:
            manifest = path / "manifest.sqlite"
            conn = _connect(manifest)
            try:
                upgraded = migrations.apply(conn, path)
            except OSError as exc:
                raise _write_error(path, exc) from None
            existing = _read_settings(conn, manifest)
            if existing is None:
                with conn:
                    conn.executemany(
                        "INSERT OR REPLACE INTO settings VALUES (?, ?)",
                        [(k, json.dumps(v)) for k, v in settings.__dict__.items()],
                    )
            else:
                check_compatible(path, existing, settings)
            store = cls(path, conn, existing or settings)
            store._lock = lock
            store.upgraded = upgraded
            store.removed = store._remove_strays()
        except BaseException:
            if conn is not None:
                conn.close()
            lock.close()
            raise
        return store

    def close(self) -> None:
        self._conn.close()
        if self._lock is not None:
            self._lock.close()  # releases the writer's lock

    # -- documents -----------------------------------------------------------------------------------------

    def documents(self) -> list[Document]:
        rows = self._conn.execute(
            "SELECT id, path, sha256, kv_file, n_chunks, n_tokens, metadata, prefill, window FROM documents ORDER BY path"
        ).fetchall()
        return [Document(*row[:6], _metadata(row[6]), *row[7:]) for row in rows]

    def document(self, path: str) -> Document | None:
        row = self._conn.execute(
            "SELECT id, path, sha256, kv_file, n_chunks, n_tokens, metadata, prefill, window FROM documents "
            "WHERE path = ?", (path,)
        ).fetchone()
        return Document(*row[:6], _metadata(row[6]), *row[7:]) if row else None

    def num_chunks(self) -> int:
        return self._conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]

    def kv_files(self, doc: Document) -> list[str]:
        rows = self._conn.execute("SELECT kv_file FROM chunks WHERE doc_id = ? ORDER BY idx", (doc.id,)).fetchall()
        return list(dict.fromkeys(r[0] for r in rows if r[0] is not None))

    def check_document(self, doc: Document, checksums: bool = True) -> list[str]:
        rows = self._conn.execute("SELECT idx, kv_file, checksum FROM chunks WHERE doc_id = ? ORDER BY idx",
                                  (doc.id,)).fetchall()
        return chunk_problems(doc.n_chunks, rows, lambda name: KVFile(self.path / "kv" / name), checksums)

    def document_writer(self, path: str, sha256: str, metadata: dict | None = None) -> "DocumentWriter":
        """A writer that adds or replaces one document part by part (`DocumentWriter`)."""
        return DocumentWriter(self, path, sha256, metadata)

    def remove_document(self, path: str) -> None:
        """Drop one document: its manifest rows first (one transaction), then its KV files where no other
        document's chunks are in them; unknown paths are a no-op."""
        old = self.document(path)
        if old is None:
            return
        files = self.kv_files(old)
        with self._conn:
            self._conn.execute("DELETE FROM chunks WHERE doc_id = ?", (old.id,))
            self._conn.execute("DELETE FROM documents WHERE id = ?", (old.id,))
        self._drop_unreferenced(files)
        self._index = None

    def _kv_sizes(self) -> dict[str, int]:
        kv = self.path / "kv"
        return {f.name: _size(f) for f in kv.iterdir()} if kv.is_dir() else {}

    def _stored_bytes(self, documents: list[dict], sizes: dict[str, int]) -> int:
        """Its documents' KV files and the manifest."""
        manifest = self.path / "manifest.sqlite"
        return sum(d["kv_bytes"] for d in documents) + (manifest.stat().st_size if manifest.exists() else 0)

    def verify(self) -> dict:
        """Check everything: the manifest (SQLite's integrity check), every document's KV files, tensors and
        checksums, and the files in `kv/`. Returns `ok` (the manifest and every document are intact),
        `manifest` ("ok" or SQLite's findings), `documents` (per document: path, state `ok` or `damaged`,
        problems), `damaged` (the damaged documents' paths), `orphans` (KV files cagkit wrote that no document
        uses, as an interrupted ingest leaves them: no damage, and the next ingest or `store repair` removes them),
        `missing` (KV files the manifest lists that are not there) and `foreign` (files in kv/ that cagkit did
        not write: left alone)."""
        findings = [r[0] for r in self._conn.execute("PRAGMA integrity_check").fetchall()]
        documents = self.documents()
        referenced = {r[0] for r in self._conn.execute("SELECT DISTINCT kv_file FROM chunks") if r[0] is not None}
        recorded = {r[0] for r in self._conn.execute("SELECT name FROM kv_files")}
        on_disk = {f.name for f in (self.path / "kv").iterdir()} if (self.path / "kv").is_dir() else set()
        orphans = sorted(n for n in on_disk if (n in recorded and n not in referenced)
                         or (is_temporary(Path(n)) and _temporary_of(n) in recorded))
        manifest = "ok" if findings == ["ok"] else "; ".join(findings)
        return self._verified(manifest, documents, referenced, on_disk, orphans, on_disk - recorded - set(orphans))

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
            raise no_documents(self.path)
        candidates = np.arange(len(index.ids))
        if documents is not None:
            candidates = np.flatnonzero(np.isin(index.paths, list(documents)))

        def lexical():
            if index.texts is None:  # by id: an ingest may have written to the store since the ids were read
                text_of = dict(self._conn.execute("SELECT id, text FROM chunks").fetchall())
                index.texts = [text_of.get(int(i), "") for i in index.ids]
            if documents is not None:  # a few documents' chunks: their own statistics, built for this search
                return LexicalIndex([index.texts[i] for i in candidates])
            if index.lexical is None:
                index.lexical = LexicalIndex(index.texts)  # built once per open store, on the first search
            return index.lexical

        best, scores = rank_chunks(index.embeddings[candidates], query, text, retrieval, top_k, lexical)
        hits = []
        for i, score in zip(candidates[best], scores):
            row = self._conn.execute(
                "SELECT d.path, c.idx, c.text, d.metadata FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE c.id = ?",
                (int(index.ids[i]),),
            ).fetchone()
            hits.append(Hit(int(index.ids[i]), row[0], row[1], row[2], float(score), _metadata(row[3])))
        return hits

    def chunk_rows(self, doc: Document) -> list[tuple[int, int, int, np.ndarray, str]]:
        """`doc`'s chunks as (chunk id, char start, char end, unit embedding [E], KV file), in document order."""
        rows = self._conn.execute("SELECT id, char_start, char_end, embedding, kv_file FROM chunks WHERE doc_id = ? "
                                  "ORDER BY idx", (doc.id,)).fetchall()
        return [(r[0], r[1], r[2], np.frombuffer(r[3], dtype=np.float32), r[4]) for r in rows]

    def chunk_ids(self, path: str) -> list[int]:
        """All chunk ids of one document, in document order."""
        doc = self.document(path)
        if doc is None:
            raise StoreError(f"document {path} is not in store {self.path}")
        return [r[0] for r in self._conn.execute("SELECT id FROM chunks WHERE doc_id = ? ORDER BY idx", (doc.id,))]

    def document_hits(self, path: str) -> list[Hit]:
        """Every chunk of one document as a `Hit` (score 0), in document order: what `--scope document` places."""
        rows = self._conn.execute("SELECT c.id, c.idx, c.text, d.metadata FROM chunks c JOIN documents d ON "
                                  "d.id = c.doc_id WHERE d.path = ? ORDER BY c.idx", (path,)).fetchall()
        return [Hit(r[0], path, r[1], r[2], 0.0, _metadata(r[3])) for r in rows]

    def token_ids(self, chunk_ids: list[int]) -> list[list[int]]:
        """Each chunk's source token ids, read from its KV file without its KV: the text exactly as the source read
        it (with document prefill, the text between chunks too). A missing chunk is a `ChunkGoneError`."""
        out = []
        for chunk_id in chunk_ids:
            row = self._conn.execute("SELECT kv_file, idx FROM chunks WHERE id = ?", (chunk_id,)).fetchone()
            if row is None or row[0] is None:
                raise chunk_gone(chunk_id, self.path)
            try:
                out.append(chunk_token_ids(KVFile(self.path / "kv" / row[0]), row[1]))
            except DamagedFile as exc:
                raise DamagedChunkError(f"KV file {self.path / 'kv' / row[0]} is damaged ({exc}); run `cagkit store "
                                        f"repair --store {self.path}`", "", row[1]) from None
        return out

    def load_chunks(self, chunk_ids: list[int]) -> list[StoredChunk | StoreError]:
        """`Store.load_chunks`: the chunks' rows in one query, and each KV file opened once for all of its
        chunks asked for (a document's chunks are a few files)."""
        ids = [int(i) for i in chunk_ids]
        rows = {r[0]: r[1:] for r in self._conn.execute(
            "SELECT c.id, d.path, c.kv_file, c.idx, c.text, c.checksum FROM chunks c JOIN documents d ON "
            f"d.id = c.doc_id WHERE c.id IN ({', '.join('?' * len(set(ids)))})", sorted(set(ids)))} if ids else {}
        by_file: dict[str | None, list[tuple]] = {}
        for chunk_id in dict.fromkeys(ids):
            if chunk_id in rows:
                doc_path, kv_file, idx, text, checksum = rows[chunk_id]
                by_file.setdefault(kv_file, []).append(
                    (chunk_id, doc_path, idx, text, checksum if kv_file is not None else None))
        found: dict[int, StoredChunk | StoreError] = {}
        for kv_file, entries in by_file.items():
            file = self.path / "kv" / (kv_file or "")
            for entry, result in zip(entries, read_chunks(lambda: KVFile(file), file, self.path, entries)):
                if isinstance(result, DamagedChunkError):
                    # a writer that replaced the document since the row was read deletes its old files: not damage
                    now = self._conn.execute("SELECT kv_file FROM chunks WHERE id = ?", (entry[0],)).fetchone()
                    if now is None or now[0] != kv_file:
                        result = chunk_gone(entry[0], self.path)
                found[entry[0]] = result
        return [found.get(i) or chunk_gone(i, self.path) for i in ids]

    # -- housekeeping --------------------------------------------------------------------------------------

    def _record_file(self, name: str) -> bool:
        """Record a KV file as cagkit's before it is written, so that a crash leaves it removable; False (and
        nothing recorded) when the name is taken, by a file cagkit recorded or any other."""
        if (self.path / "kv" / name).exists():
            return False
        with self._conn:
            cur = self._conn.execute("INSERT OR IGNORE INTO kv_files (name, written_at) VALUES (?, ?)",
                                     (name, time.time()))
        return cur.rowcount == 1

    def _drop_unreferenced(self, names: Iterable[str]) -> list[str]:
        """Delete those of `names` (KV files cagkit recorded) that no chunk is in any more; the names deleted."""
        removed = []
        for name in names:
            if self._conn.execute("SELECT 1 FROM chunks WHERE kv_file = ? LIMIT 1", (name,)).fetchone():
                continue
            if not self._conn.execute("SELECT 1 FROM kv_files WHERE name = ?", (name,)).fetchone():
                continue  # not one cagkit recorded writing: left alone
            file = self.path / "kv" / name
            try:
                existed = file.exists()
                file.unlink(missing_ok=True)
            except OSError as exc:
                raise _write_error(self.path, exc) from None
            with self._conn:
                self._conn.execute("DELETE FROM kv_files WHERE name = ?", (name,))
            if existed:
                removed.append(name)
        return removed

    def _remove_strays(self) -> list[str]:
        """Delete what an interrupted write left: KV files cagkit recorded that no chunk is in, and the
        temporaries of recorded files. Nothing else in the folder is touched."""
        recorded = [r[0] for r in self._conn.execute("SELECT name FROM kv_files ORDER BY name")]
        removed = self._drop_unreferenced(recorded)
        known = set(recorded)
        for file in sorted((self.path / "kv").iterdir()):
            if is_temporary(file) and _temporary_of(file.name) in known:
                try:
                    file.unlink(missing_ok=True)
                except OSError as exc:
                    raise _write_error(self.path, exc) from None
                removed.append(file.name)
        return removed



class DocumentWriter(BaseDocumentWriter):
    """Adds or replaces one document in a store open for writing, its chunks written part by part as they are
    prefilled (`add`: one KV file per part), so that holding a long document's KV is never needed; `commit`
    records the document and its chunks in one transaction, and only then do readers see it. Leaving the `with`
    block without `commit` (an error) removes the parts written; after a crash the next writer removes them.
    Every writer's files have names of their own, so no other document, nor the older version of this one,
    shares them."""

    def __init__(self, store: SQLiteStore, path: str, sha256: str, metadata: dict | None = None):
        if store._lock is None:
            raise StoreError(f"store {store.path} is open for reading; open it with Store.open_for_writing to add documents")
        super().__init__(store, path, sha256, metadata)
        self._write = secrets.token_hex(4)
        self._files: list[str] = []

    def _write_part(self, chunks: list[NewChunk], tensors: dict, first: int) -> tuple[str, dict[int, str]]:
        st = self.store
        name = f"{self.sha256[:16]}-{self._write}.{len(self._files):05d}.safetensors"
        while not st._record_file(name):  # a name in use (as likely as two equal random draws): draw again
            self._write = secrets.token_hex(4)
            name = f"{self.sha256[:16]}-{self._write}.{len(self._files):05d}.safetensors"
        self._files.append(name)
        file = st.path / "kv" / name
        try:
            save_safetensors(tensors, file, metadata=self._file_metadata(first, document=self.path))
        except OSError as exc:
            raise _write_error(st.path, exc) from None
        del tensors
        sums = chunk_checksums(file, range(first, first + len(chunks)), CHUNK_TENSORS)
        if any(v is None for v in sums.values()):
            raise StoreError(f"KV file {file} does not read back as written; check the disk of store {st.path}")
        return name, sums

    def _add_rows(self, chunks: list[NewChunk], embeddings: np.ndarray, first: int, name: str,
                  sums: dict[int, str]) -> None:
        for i, c in enumerate(chunks, start=first):
            self._rows.append((i, c.text, c.char_start, c.char_end, len(c.token_ids),
                               np.asarray(embeddings[i - first]).astype(np.float32).tobytes(), name, sums[i]))

    def commit(self) -> None:
        """Record the document with every chunk added, replacing its older version in one transaction; the older
        version's KV files are deleted after."""
        st = self.store
        conn = st._conn
        old = st.document(self.path)
        old_files = st.kv_files(old) if old is not None else []
        with conn:
            if old is not None:
                conn.execute("DELETE FROM chunks WHERE doc_id = ?", (old.id,))
                conn.execute("DELETE FROM documents WHERE id = ?", (old.id,))
            cur = conn.execute(
                "INSERT INTO documents (path, sha256, kv_file, n_chunks, n_tokens, ingested_at, metadata, prefill, "
                "window) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (self.path, self.sha256, self._files[0] if self._files else "", len(self._rows),
                 sum(r[4] for r in self._rows), time.time(), json.dumps(self.metadata) if self.metadata else None,
                 self.prefill, self.window),
            )
            conn.executemany(
                "INSERT INTO chunks (doc_id, idx, text, char_start, char_end, n_tokens, embedding, kv_file, checksum) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [(cur.lastrowid, *row) for row in self._rows])
        self._committed = True
        st._drop_unreferenced(old_files)
        st._index = None

    def abort(self) -> None:
        """Remove the parts written so far (best effort: what is left, the next writer removes)."""
        try:
            self.store._drop_unreferenced(self._files)
        except (StoreError, OSError):
            pass
        self._files = []


def chunk_token_ids(file: KVFile, idx: int) -> list[int]:
    """Chunk `idx`'s `token_ids` tensor alone from an open KV file (not checked against the chunk's checksum,
    which covers all its tensors: a damaged file is found where the chunk's KV is read)."""
    name = f"{idx}.token_ids"
    if name not in file.tensors:
        raise DamagedFile(f"chunk {idx} lacks its token_ids")
    dtype, shape, begin, end = file.tensors[name]
    (buf,) = file._read([(begin, end)])
    return to_torch(dtype, shape, buf).tolist()


def _size(file: Path) -> int:
    try:
        return file.stat().st_size
    except OSError:
        return 0


def _temporary_of(name: str) -> str | None:
    """The file an `atomic_write` temporary `<name>.<pid>.<n>.tmp` was to become."""
    match = re.fullmatch(r"(.+)\.\d+\.\d+\.tmp", name)
    return match.group(1) if match else None


def _check_writable(path: Path) -> None:
    import os

    for target in (path, path / "kv", path / "manifest.sqlite"):
        if target.exists() and not os.access(target, os.W_OK):
            raise StoreError(f"cannot write to store {path} ({target.name} is read-only); give yourself write "
                             f"access to it or use another --store")


def _write_error(path: Path, exc: OSError) -> StoreError:
    return StoreError(f"cannot write to store {path} ({exc.strerror or exc}); give yourself write access to it, free "
                      f"some space, or use another --store")



def _metadata(column: str | None) -> dict:
    return json.loads(column) if column else {}


def _lock_for_writing(path: Path, wait: bool = False):
    """An exclusive lock on the store; a second writer gets a clear error instead of racing the first, or with
    `wait` blocks until the first is done."""
    handle = _try_lock(path)
    if handle is None:
        if not wait:
            raise StoreBusyError(f"store {path} is being written by another cagkit ingest; wait for it to finish, or "
                                 f"pass --wait to wait for it")
        print(f"store {path} is being written by another cagkit process; waiting for it", file=sys.stderr, flush=True)
        handle = _open_lock(path)
        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _try_lock(path: Path):
    """The store's writer lock if no other process holds it, else None."""
    handle = _open_lock(path)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _open_lock(path: Path):
    try:
        return open(path / "write.lock", "a")  # "a": opening never truncates or creates more than the lock file
    except OSError as exc:
        raise StoreError(f"cannot write to store {path} ({exc.strerror}); give yourself write access to it or use "
                         f"another --store") from None


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
        except OSError as exc:
            raise _write_error(path, exc) from None
        finally:
            lock.close()


def _manifest_error(manifest: Path, exc: sqlite3.Error) -> StoreError:
    """The one-line error for an SQLite failure on `manifest`."""
    message = str(exc)
    if "readonly" in message or "read-only" in message:
        return StoreError(f"cannot write to store {manifest.parent} (its manifest is read-only); give yourself write "
                          f"access to it or use another --store")
    if "locked" in message or "busy" in message:
        return StoreError(f"store {manifest.parent} is busy (another process holds its manifest); try again, or pass "
                          f"--wait to ingest")
    if "disk is full" in message or "disk I/O" in message or "unable to open" in message:
        return StoreError(f"cannot use store {manifest.parent} ({message}); free some space or check the disk and "
                          f"its permissions")
    return DamagedManifestError(f"store manifest {manifest} is damaged ({message}); move the store aside and re-run "
                                f"`cagkit ingest DOCS --store {manifest.parent}`")


@contextmanager
def _translated(manifest: Path):
    try:
        yield
    except sqlite3.Error as exc:
        raise _manifest_error(manifest, exc) from None


def _translating(method):
    """A cursor's `method` whose SQLite errors are one-line StoreErrors naming the store."""

    @functools.wraps(method)
    def call(self, *args):
        with _translated(self.connection.manifest):
            return method(self, *args)

    return call


class _Cursor(sqlite3.Cursor):
    """A cursor whose SQLite errors, also those met while rows are read, are one-line StoreErrors."""

    execute = _translating(sqlite3.Cursor.execute)
    executemany = _translating(sqlite3.Cursor.executemany)
    fetchone = _translating(sqlite3.Cursor.fetchone)
    fetchall = _translating(sqlite3.Cursor.fetchall)
    __next__ = _translating(sqlite3.Cursor.__next__)


class _Connection(sqlite3.Connection):
    """The manifest's connection: every SQLite error becomes a one-line StoreError naming the store."""

    manifest: Path

    def cursor(self, factory=_Cursor):
        return super().cursor(factory)

    def execute(self, *args):
        return self.cursor().execute(*args)

    def executemany(self, *args):
        return self.cursor().executemany(*args)

    def executescript(self, script):
        with _translated(self.manifest):
            return super().executescript(script)

    def commit(self):
        with _translated(self.manifest):
            return super().commit()

    def __exit__(self, *exc):
        with _translated(self.manifest):
            return super().__exit__(*exc)


def _connect(manifest: Path) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(manifest, factory=_Connection)
    except sqlite3.Error as exc:
        raise _manifest_error(manifest, exc) from None
    conn.manifest = manifest
    conn.execute("PRAGMA foreign_keys = ON")
    migrations.pending(conn, manifest.parent)  # reads the manifest: a damaged one fails here, not later
    return conn


def _read_settings(conn: sqlite3.Connection, manifest: Path) -> StoreSettings | None:
    rows = dict(conn.execute("SELECT key, value FROM settings").fetchall())
    if not rows:
        return None
    try:
        values = {k: json.loads(v) for k, v in rows.items()}
    except ValueError:
        raise DamagedManifestError(f"store manifest {manifest} is damaged (its settings are not JSON); move the "
                                   f"store aside and re-run `cagkit ingest DOCS --store {manifest.parent}`") from None
    return settings_from(values, manifest.parent, DamagedManifestError(
        f"store manifest {manifest} is damaged (unexpected settings); move the store aside and re-run "
        f"`cagkit ingest DOCS --store {manifest.parent}`"))

