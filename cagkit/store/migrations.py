"""Changes to the store format as numbered migrations, applied in order when a store is opened.

Each `mNNN_name(path, conn)` takes a store (its directory and open manifest) from the state the migrations before
it leave to the next, and returns the paths of the documents whose KV files it rewrote. Their names are recorded in the manifest's `migrations` table as they complete, so each runs
once per store, and a store that a newer cagkit migrated further is refused rather than misread. A change to the
format is a new function at the end of `MIGRATIONS`; code that reads a store then reads one format only.

A migration is recorded only once it has completed, and each can run again over its own partial work: the KV
files it rewrites are replaced atomically, so an interrupted migration is finished the next time the store is
opened for writing.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from cagkit.store.base import CHUNK_TENSORS, sentence_tensors

Migration = Callable[[Path, sqlite3.Connection], list[str]]


def m001_create_tables(path: Path, conn: sqlite3.Connection) -> list[str]:
    """The manifest's tables. Stores created before migrations were recorded have them already."""
    conn.executescript("""
        CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE IF NOT EXISTS documents (
            id INTEGER PRIMARY KEY, path TEXT UNIQUE NOT NULL, sha256 TEXT NOT NULL, kv_file TEXT NOT NULL,
            n_chunks INTEGER NOT NULL, n_tokens INTEGER NOT NULL, ingested_at REAL NOT NULL, metadata TEXT);
        CREATE TABLE IF NOT EXISTS chunks (
            id INTEGER PRIMARY KEY, doc_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            idx INTEGER NOT NULL, text TEXT NOT NULL, char_start INTEGER NOT NULL, char_end INTEGER NOT NULL,
            n_tokens INTEGER NOT NULL, embedding BLOB NOT NULL);
        CREATE INDEX IF NOT EXISTS chunks_doc ON chunks(doc_id);
    """)
    return []


def m002_sentence_embeddings(path: Path, conn: sqlite3.Connection) -> list[str]:
    """Each chunk's sentence spans `{i}.sentences` [S, 2] int32 and their embeddings `{i}.sentence_embeddings`
    [S, E] float16, which the repair selects tokens by, added to KV files written before they were kept. The KV
    itself is copied unchanged; a file that does not open is left for `verify` to report."""
    from safetensors import safe_open

    from cagkit.files import save_safetensors
    from cagkit.retrieval.embeddings import EMBEDDER_NAME, embed_sentences

    embedder = conn.execute("SELECT value FROM settings WHERE key = 'embedder'").fetchone()
    if embedder is None or json.loads(embedder[0]) != EMBEDDER_NAME:
        return []  # a new store, or one written without this embedder: no sentence vectors to add
    upgraded = []
    for doc_id, doc_path, kv_file in conn.execute("SELECT id, path, kv_file FROM documents").fetchall():
        file = path / "kv" / kv_file
        try:
            with safe_open(file, framework="pt") as f:
                if any(key.endswith(".sentences") for key in f.keys()):
                    continue
                meta = f.metadata()
                tensors = {key: f.get_tensor(key) for key in f.keys()}
        except Exception:  # safetensors raises several types for damaged files
            continue
        texts = [r[0] for r in conn.execute("SELECT text FROM chunks WHERE doc_id = ? ORDER BY idx", (doc_id,))]
        for i, sentences in enumerate(embed_sentences(texts)):
            tensors.update(sentence_tensors(i, sentences))
        save_safetensors(tensors, file, metadata=meta)
        upgraded.append(doc_path)
    return upgraded


def m003_chunk_files_and_checksums(path: Path, conn: sqlite3.Connection) -> list[str]:
    """Each chunk names the KV file that holds it (`chunks.kv_file`: a long document is written in parts, one
    file each) and the checksum of its tensors (`chunks.checksum`, see `cagkit.store.kvfile`), and every KV file
    cagkit wrote is recorded in `kv_files`, the only files in the folder cagkit ever deletes.

    Existing chunks get their document's file, and their checksums are computed here from the files as they are
    (one read of each KV file); a chunk whose file does not open or lacks its tensors gets none, so `verify`
    reports its document damaged and the next ingest or `store repair` rebuilds it. Files two documents with the
    same text shared stay shared: a file is deleted only once no chunk is in it. No KV file is rewritten."""
    from cagkit.store.kvfile import chunk_checksums

    columns = {r[1] for r in conn.execute("PRAGMA table_info(chunks)").fetchall()}
    with conn:
        if "kv_file" not in columns:
            conn.execute("ALTER TABLE chunks ADD COLUMN kv_file TEXT")
        if "checksum" not in columns:
            conn.execute("ALTER TABLE chunks ADD COLUMN checksum TEXT")
        conn.execute("CREATE TABLE IF NOT EXISTS kv_files (name TEXT PRIMARY KEY, written_at REAL NOT NULL)")
        conn.execute("CREATE INDEX IF NOT EXISTS chunks_kv_file ON chunks(kv_file)")
        conn.execute("UPDATE chunks SET kv_file = (SELECT d.kv_file FROM documents d WHERE d.id = chunks.doc_id) "
                     "WHERE kv_file IS NULL")
        conn.execute("INSERT OR IGNORE INTO kv_files (name, written_at) SELECT DISTINCT kv_file, ? FROM chunks "
                     "WHERE kv_file IS NOT NULL", (time.time(),))
    for (name,) in conn.execute("SELECT DISTINCT kv_file FROM chunks WHERE checksum IS NULL").fetchall():
        indices = [r[0] for r in conn.execute("SELECT DISTINCT idx FROM chunks WHERE kv_file = ? AND checksum IS NULL",
                                              (name,)).fetchall()]
        sums = chunk_checksums(path / "kv" / name, indices, CHUNK_TENSORS)
        with conn:
            conn.executemany("UPDATE chunks SET checksum = ? WHERE kv_file = ? AND idx = ? AND checksum IS NULL",
                             [(sums[i], name, i) for i in indices if sums[i] is not None])
    return []


def m004_document_prefill(path: Path, conn: sqlite3.Connection) -> list[str]:
    """How each document was prefilled (`documents.prefill`: `document`, read whole as the model reads it, each
    chunk's KV its slice of that cache, or `chunks`, each chunk alone) and the window it was read over
    (`documents.window`, tokens; NULL for `chunks`). Every document stored before this migration had its chunks
    prefilled alone, so it is recorded as `chunks`; its KV files are not touched."""
    columns = {r[1] for r in conn.execute("PRAGMA table_info(documents)").fetchall()}
    with conn:
        if "prefill" not in columns:
            conn.execute("ALTER TABLE documents ADD COLUMN prefill TEXT NOT NULL DEFAULT 'chunks'")
        if "window" not in columns:
            conn.execute("ALTER TABLE documents ADD COLUMN window INTEGER")
    return []


def m005_compressed_kv(path: Path, conn: sqlite3.Connection) -> list[str]:
    """Nothing to change: a store may now hold int8 or int4 KV (`settings.dtype`; codes with their scales beside
    them, `cagkit.kv.quant`), which a cagkit from before would read as float16 and place as garbage. Recorded, it
    makes such a cagkit refuse the store instead (`pending`)."""
    return []


MIGRATIONS: list[Migration] = [m001_create_tables, m002_sentence_embeddings, m003_chunk_files_and_checksums,
                               m004_document_prefill, m005_compressed_kv]


def pending(conn: sqlite3.Connection, store: Path) -> list[Migration]:
    """The migrations `store` has not had yet, in order; a StoreError if a newer cagkit migrated it further."""
    from cagkit.errors import StoreError

    recorded = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'").fetchone()
    done = {r[0] for r in conn.execute("SELECT name FROM migrations")} if recorded else set()
    unknown = done - {m.__name__ for m in MIGRATIONS}
    if unknown:
        raise StoreError(f"store {store} was upgraded by a newer cagkit (migration {', '.join(sorted(unknown))}); "
                         f"upgrade cagkit to read it")
    return [m for m in MIGRATIONS if m.__name__ not in done]


def apply(conn: sqlite3.Connection, store: Path) -> list[str]:
    """Apply the pending migrations to `store` in order, each recorded as it completes; the paths of the documents
    whose KV files they rewrote. The caller holds the store's writer lock."""
    conn.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    upgraded = []
    for migration in pending(conn, store):
        upgraded += migration(store, conn)
        with conn:
            conn.execute("INSERT INTO migrations VALUES (?, ?)", (migration.__name__, time.time()))
    return list(dict.fromkeys(upgraded))
