"""A store whose manifest and search index are LanceDB tables, on local disk or on any S3-compatible service.

`open_store` (and `Store.open`, `Store.open_for_writing`) return one for a URL (`s3://bucket/prefix`) or a local
folder that holds one; `cagkit store migrate` copies a store of the default kind (SQLite, one machine) into one.
It offers what `Store` does (documents, search, `load_chunk`, verify, the writer), so ingest, ask, eval and serve use it
unchanged, and it differs where being shared demands:

    settings.json                  what the store was built with (as the SQLite store's settings table)
    manifest/chunks.lance          one row per chunk: its document (path, content hash, metadata, chunk and
                                   token counts, how it was prefilled: `doc_prefill` and `doc_window`, as
                                   `Document.prefill` and `.window`), text, char offsets, token ids and their char
                                   spans, unit embedding, sentence spans and embeddings, KV file and checksum
    kv/<sha256>.safetensors        a part of a document's chunks as `Store` writes them (with `{i}.context` where
                                   the document was prefilled whole); the name is the SHA-256 of the source
                                   model's fingerprint, the format, the dtype, the part's first chunk index and
                                   every chunk's token ids and, for a document prefilled whole, every chunk's
                                   context and the name of the document's part before (whose KV the part attended
                                   to, and so on back to its start), so every process, on any machine, names the
                                   same KV the same way

- **Readers never see a row whose file is missing**: a writer puts its KV files first, then commits all of a
  document's rows in one LanceDB commit (a merge that also drops the rows of its older version), so a document
  is replaced whole or not at all.
- **Several writers at once**: LanceDB commits are versioned and appends from several processes (or machines)
  are retried against each other; there is no writer lock. A KV file two writers both write has the same name
  and the same bytes.
- **Files no row uses** (an interrupted ingest's, or a replaced document's) are removed by the next writer, and
  by `store repair`, once they are older than `ORPHAN_GRACE_S`: younger ones may belong to a writer that has not
  committed yet. Only files named as cagkit names KV files are ever removed.
- **Search**: LanceDB's vector search (exact below `VECTOR_INDEX_ROWS` chunks; an IVF_PQ index, built when a
  writer closes the store, above) and its full-text (BM25) index, fused by reciprocal rank as `Store` fuses its
  own; searching a few documents (`documents=`) ranks their rows exactly as `Store` does.
- **Format changes** are made to the table in place, as the SQLite store's numbered migrations are, and read
  either way. The one so far, the Lance store's m004_document_prefill: `doc_prefill` and `doc_window`, which
  tables written before lack. A reader selects only the columns a table has, and reads a document without them,
  or with them null, as `chunks` (prefilled alone, no window): that is how every document was stored before. The
  first writer to open such a table, or to commit into it, adds both columns, all null (`_upgrade`; a writer
  that finds another has just added them carries on), and only then writes rows that fill them.
- **Remote failures**: every S3 request has a timeout and a number of attempts in all (`remote_limits`: 30 s and
  3 unless `$CAGKIT_S3_TIMEOUT` and `$CAGKIT_S3_ATTEMPTS` say otherwise), so an endpoint that never answers fails
  an operation after about their product; what still fails is a one-line StoreError naming the store, never a
  hang.

Credentials and endpoint come from the environment, as for any S3 client (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL` for a service other than AWS, `AWS_DEFAULT_REGION`).
Needs the `scale` extra: `pip install 'cagkit[scale]'`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from cagkit.config import KV_DTYPES
from cagkit.errors import StoreError
from cagkit.files import atomic_write, write_json_atomic
from cagkit.store.base import (
    CHUNK_TENSORS,
    FORMAT_VERSION,
    BaseDocumentWriter,
    ChunkGoneError,
    Document,
    Hit,
    NewChunk,
    Store,
    StoredChunk,
    StoreSettings,
    check_compatible,
    check_dtype,
    check_store_folder,
    chunk_gone,
    chunk_problems,
    is_url,
    no_documents,
    rank_chunks,
    read_chunk,
    read_chunks,
    settings_from,
)
from cagkit.store.kvfile import KVFile, chunk_checksums

SETTINGS_FILE = "settings.json"
MANIFEST = "manifest"  # the LanceDB database
TABLE = "chunks"
VECTOR_INDEX_ROWS = 100_000  # above this many chunks a writer builds an IVF_PQ index as it closes the store
NPROBES, REFINE_FACTOR = 20, 50  # recall@10 0.99 at 1M synthetic chunks (docs/scale.md)
CANDIDATES = 100  # each ranking's list, fused by reciprocal rank: at least this many, or 10 x top_k
ORPHAN_GRACE_S = 3600.0
COMMIT_ATTEMPTS = 5  # a manifest commit that loses a race with another writer's is merged again, this many tries in all
PARALLEL_READS = 16  # KV files a question's chunks read at once
REMOTE_TIMEOUT_S = 30  # each S3 request's timeout, seconds ($CAGKIT_S3_TIMEOUT)
REMOTE_ATTEMPTS = 3  # each S3 request's attempts in all, the first included ($CAGKIT_S3_ATTEMPTS)
STAGING_PREFIX = "ingest-"  # tables `cagkit ingest --ray` stages rows in: ingest-<unix time>-<random>
_KV_NAME = re.compile(r"[0-9a-f]{64}\.safetensors")


def is_lance_store(location: str | Path) -> bool:
    """Whether `location` is (or, a URL, is to be) a LanceDB store rather than a SQLite one."""
    if is_url(location):
        return True
    path = Path(str(location).removeprefix("file://"))
    return (path / SETTINGS_FILE).is_file() and not (path / "manifest.sqlite").exists()


def remote_limits() -> tuple[float, int]:
    """Each S3 request's timeout in seconds and its attempts in all: `$CAGKIT_S3_TIMEOUT` and `$CAGKIT_S3_ATTEMPTS`,
    else `REMOTE_TIMEOUT_S` and `REMOTE_ATTEMPTS`. An endpoint that accepts connections and never answers fails a
    request, and so the operation that made it, after about timeout x attempts (plus a few seconds of backoff)."""
    limits = []
    for name, default, kind, example in (("CAGKIT_S3_TIMEOUT", REMOTE_TIMEOUT_S, float, "30"),
                                         ("CAGKIT_S3_ATTEMPTS", REMOTE_ATTEMPTS, int, "3")):
        raw = os.environ.get(name, "").strip()
        try:
            value = kind(raw) if raw else default
        except ValueError:
            value = 0
        if not value > 0:
            raise StoreError(f"{name}={raw!r} is not a positive {'number of seconds' if kind is float else 'count'}; "
                             f"set it to e.g. {example}, or unset it")
        limits.append(value)
    return limits[0], limits[1]


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _int_id(*parts: str) -> int:
    """A stable 60-bit id from `parts`: the same in every process and on every machine."""
    return int(hashlib.sha256("\0".join(parts).encode()).hexdigest()[:15], 16)


def kv_file_name(settings: StoreSettings, first: int, token_ids: Iterable[list[int]],
                 contexts: Iterable[tuple[int, ...] | None] | None = None, before: str | None = None) -> str:
    """The content hash that names a KV file: the source model's fingerprint, format, dtype, first chunk index and
    every chunk's token ids; for chunks prefilled in their document (`NewChunk.context` not None) also each one's
    context and `before`, the name of the document's part before this one: its KV, and so everything read before
    it, went into this part's. Chunks prefilled alone are named by their own content only, as they always were."""
    digest = hashlib.sha256(f"{settings.source_fingerprint}\0{FORMAT_VERSION}\0{settings.dtype}\0{first}".encode())
    token_ids = list(token_ids)
    contexts = list(contexts) if contexts is not None else [None] * len(token_ids)
    if len(contexts) != len(token_ids):
        raise ValueError(f"{len(contexts)} contexts for {len(token_ids)} chunks")
    for ids, context in zip(token_ids, contexts):
        digest.update(b"\1" + np.asarray(ids, dtype="<i4").tobytes())
        if context is not None:
            digest.update(b"\2" + np.asarray(context, dtype="<i4").tobytes())
    if before is not None and any(c is not None for c in contexts):
        digest.update(b"\3" + before.encode())
    return digest.hexdigest() + ".safetensors"


@dataclass
class _Location:
    """Where a store lives: an fsspec filesystem and the root on it, and the URL LanceDB opens."""

    url: str
    fs: object
    root: str
    remote: bool

    def path(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def lance_uri(self) -> str:
        return self.url.rstrip("/") + "/" + MANIFEST if self.remote else str(Path(self.root) / MANIFEST)

    def storage_options(self) -> dict:
        if not self.remote:
            return {}
        timeout, attempts = remote_limits()
        options = {"timeout": f"{timeout:g}s", "connect_timeout": f"{min(timeout, 5):g}s",
                   "client_max_retries": str(attempts - 1), "client_retry_timeout": f"{timeout * attempts:g}s"}
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
        if endpoint:
            options["aws_endpoint"] = endpoint  # also for processes that do not share this environment (Ray)
        if endpoint.startswith("http://"):
            options["allow_http"] = "true"
        return options

    def error(self, exc: BaseException, doing: str) -> StoreError:
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        hint = ("check the URL, AWS_ENDPOINT_URL and your credentials, and that the bucket exists"
                if self.remote else "check the folder and its permissions")
        return StoreError(f"cannot {doing} store {self.url} ({reason}); {hint}")


def _locate(location: str | Path) -> _Location:
    try:
        import fsspec
    except ImportError:
        raise StoreError("a store at a URL needs the scale extra: pip install 'cagkit[scale]'") from None
    text = str(location)
    if not is_url(text):
        path = Path(text.removeprefix("file://")).expanduser().absolute()
        return _Location(str(path), fsspec.filesystem("file", auto_mkdir=True), str(path), remote=False)
    options = {}
    if text.startswith("s3://"):
        timeout, attempts = remote_limits()
        # botocore's `total_max_attempts` counts the first attempt (its `max_attempts` does not)
        options = {"config_kwargs": {"connect_timeout": min(timeout, 5), "read_timeout": timeout,
                                     "retries": {"total_max_attempts": attempts, "mode": "standard"}},
                   "skip_instance_cache": True}  # the environment as it is now decides the endpoint
    try:
        fs, root = fsspec.core.url_to_fs(text, **options)
    except (ImportError, ValueError) as exc:
        raise StoreError(f"cannot open store {text} ({exc}); install the scale extra (pip install 'cagkit[scale]') "
                         f"or give a local folder or an s3:// URL") from None
    if text.startswith("s3://"):
        # s3fs tries each call 5 times, each time with all of botocore's attempts (5 x 4 requests of 30 s to an
        # endpoint that never answered, when `max_attempts: 3` meant 4): botocore's attempts alone bound a request
        fs.retries = 1
    return _Location(text.rstrip("/"), fs, root, remote=True)


def _lancedb():
    try:
        import lancedb
    except ImportError:
        raise StoreError("this store's manifest is a LanceDB table, which needs the scale extra: "
                         "pip install 'cagkit[scale]'") from None
    return lancedb


def _schema(dim: int):
    import pyarrow as pa

    return pa.schema([
        ("chunk_id", pa.int64()), ("doc_path", pa.string()), ("doc_sha", pa.string()),
        ("doc_metadata", pa.string()), ("doc_chunks", pa.int32()), ("doc_tokens", pa.int64()),
        *[(f.name, f.type) for f in _added_columns()],
        ("ingested_at", pa.float64()), ("idx", pa.int32()), ("text", pa.string()), ("char_start", pa.int32()),
        ("char_end", pa.int32()), ("n_tokens", pa.int32()), ("token_ids", pa.list_(pa.int32())),
        ("offsets", pa.list_(pa.int32())), ("vector", pa.list_(pa.float32(), dim)),
        ("sentence_spans", pa.list_(pa.int32())), ("sentence_embeddings", pa.list_(pa.float32())),
        ("kv_file", pa.string()), ("checksum", pa.string()),
    ])


def _added_columns():
    """The columns added to the table since the first format (see the module's docstring, "Format changes"):
    nullable, so that rows written without them read as before."""
    import pyarrow as pa

    return [pa.field("doc_prefill", pa.string()), pa.field("doc_window", pa.int32())]


def staging_schema():
    """The rows `cagkit ingest --ray` stages: the manifest's, with embeddings of any length."""
    import pyarrow as pa

    schema = _schema(1)
    return schema.set(schema.get_field_index("vector"), pa.field("vector", pa.list_(pa.float32())))


_DOC_COLUMNS = ["doc_path", "doc_sha", "doc_metadata", "doc_chunks", "doc_tokens", "doc_prefill", "doc_window", "idx",
                "kv_file"]
_ADDED = ("doc_prefill", "doc_window")  # `_added_columns`: a table written before lacks them


def _one_version(method):
    """A read of several queries that all see one version of the manifest, checked out once (at the first query)
    rather than before each; a read inside another keeps the outer one's version."""

    @functools.wraps(method)
    def read(self, *args, **kwargs):
        if self._in_read:
            return method(self, *args, **kwargs)
        self._in_read = True
        try:
            return method(self, *args, **kwargs)
        finally:
            self._in_read = self._version_held = False

    return read


class LanceStore(Store):
    """A store on LanceDB (see the module's docstring). Open with `Store.open` / `Store.open_for_writing`."""

    kind = "lance"

    def __init__(self, location: _Location, table, settings: StoreSettings, writable: bool):
        self._loc = location
        self.path = location.url
        self._table = table  # None until the first document is committed
        self.settings = settings
        self.writable = writable
        self.upgraded: list[str] = []  # documents whose KV files an upgrade rewrote: none (`_upgrade` adds columns)
        self.removed: list[str] = []
        self._db = None
        self._in_read = self._version_held = False  # `_one_version`

    # -- opening -------------------------------------------------------------------------------------------

    @classmethod
    def is_at(cls, location: str | Path) -> bool:
        if is_url(location):
            try:
                return _read_settings(_locate(location)) is not None
            except StoreError:
                return False
        return is_lance_store(location)

    @classmethod
    def takes(cls, location: str | Path) -> bool:
        return is_lance_store(location)

    @classmethod
    def check_folder(cls, path: Path) -> None:
        check_store_folder(path, SETTINGS_FILE)

    @classmethod
    def open(cls, location: str | Path) -> "LanceStore":
        loc = _locate(location)
        settings = _read_settings(loc)
        if settings is None:
            raise StoreError(f"no cagkit store at {loc.url} (no {SETTINGS_FILE}); create one with "
                             f"`cagkit ingest DOCS --store {loc.url}`")
        return cls(loc, _open_table(loc), settings, writable=False)

    @classmethod
    def open_for_writing(cls, location: str | Path, settings: StoreSettings, wait: bool = False,
                         orphan_grace_s: float = ORPHAN_GRACE_S) -> "LanceStore":
        """Create the store or open it after checking `settings` match. Other writers may work at the same time
        (`wait` is accepted for `Store`'s sake: there is nothing to wait for)."""
        loc = _locate(location)
        if not loc.remote:
            cls.check_folder(Path(loc.root))
        existing = _read_settings(loc)
        if existing is None:
            _write_settings(loc, settings)
            existing = _read_settings(loc) or settings  # a writer that created it first decides
        check_compatible(loc.url, existing, settings)
        store = cls(loc, _open_table(loc), existing, writable=True)
        store._upgrade(store._table)
        store.removed = store.remove_orphans(orphan_grace_s)
        return store

    @classmethod
    def for_workers(cls, location: str | Path, settings: StoreSettings) -> "LanceStore":
        """The store as a process that only writes KV files sees it (a Ray actor): the driver that opened it for
        writing did the checks and commits the rows."""
        return cls(_locate(location), None, settings, writable=True)

    def storage_options(self) -> dict:
        """What LanceDB (and lance-ray) need to open this store's tables: timeouts, retries, the endpoint."""
        return self._loc.storage_options()

    def staging_uri(self, name: str) -> str:
        """Where a staging table `name` of `cagkit ingest --ray` lives: beside the manifest's table."""
        return self._loc.lance_uri().rstrip("/") + f"/{name}.lance"

    def commit_staged(self, name: str, documents_per_commit: int) -> list[tuple[str, int, int]]:
        """Commit the rows staged in table `name` into the manifest, `documents_per_commit` documents (each whole,
        replacing its older version) per commit, then drop the staging table. Returns (path, chunks, tokens) per
        document committed."""
        self._require_writable()
        db = self._connect()
        try:
            if name not in db.list_tables().tables:
                return []
            rows = db.open_table(name).to_arrow().to_pylist()
        except Exception as exc:  # noqa: BLE001
            raise self._loc.error(exc, "read") from None
        by_doc: dict[str, list[dict]] = {}
        for row in rows:
            by_doc.setdefault(row["doc_path"], []).append(row)
        done = []
        paths = sorted(by_doc)
        for start in range(0, len(paths), documents_per_commit):
            batch = paths[start:start + documents_per_commit]
            self.commit_rows([r for p in batch for r in sorted(by_doc[p], key=lambda r: r["idx"])], replace=batch)
            done += [(p, len(by_doc[p]), sum(r["n_tokens"] for r in by_doc[p])) for p in batch]
        self._drop_table(name)
        return done

    def _drop_table(self, name: str) -> None:
        try:
            self._connect().drop_table(name)
        except Exception as exc:  # noqa: BLE001
            warnings.warn(f"store {self.path}: could not drop staging table {name} ({str(exc)[:120]}); the next "
                          f"writer removes it", stacklevel=2)

    def close(self) -> None:
        if self.writable and self._table is not None:
            self._index()
        self._table = None

    # -- documents -----------------------------------------------------------------------------------------

    def _rows(self, columns: list[str], where: str | None = None):
        """The manifest's rows (those matching `where`), `columns` only, as a pyarrow table."""
        table = self._fresh()
        if table is None:
            import pyarrow as pa

            return pa.table({c: [] for c in columns})
        present = set(table.schema.names)
        columns = [c for c in columns if c in present or c not in _ADDED]  # a table written before lacks those
        try:
            query = table.search().select(columns)
            if where is not None:
                query = query.where(where)
            return query.limit(None).to_arrow()
        except Exception as exc:  # noqa: BLE001 - LanceDB and object-store errors have no common base
            raise self._loc.error(exc, "read") from None

    def _fresh(self):
        """The table at its latest version: a reader sees what other processes committed since it opened. Once
        per read: within a `_one_version` read, the version its first query checked out."""
        if self._version_held:
            return self._table
        if self._table is None:
            self._table = _open_table(self._loc)
        else:
            try:
                self._table.checkout_latest()
            except Exception as exc:  # noqa: BLE001
                raise self._loc.error(exc, "read") from None
        self._version_held = self._in_read
        return self._table

    def documents(self) -> list[Document]:
        return sorted(_documents(self._rows(_DOC_COLUMNS)).values(), key=lambda d: d.path)

    def document(self, path: str) -> Document | None:
        return _documents(self._rows(_DOC_COLUMNS, f"doc_path = {_quote(path)}")).get(path)

    def num_chunks(self) -> int:
        table = self._fresh()
        return 0 if table is None else table.count_rows()

    def kv_files(self, doc: Document) -> list[str]:
        rows = self._rows(["idx", "kv_file"], f"doc_path = {_quote(doc.path)}").to_pylist()
        return list(dict.fromkeys(r["kv_file"] for r in sorted(rows, key=lambda r: r["idx"])))

    def check_document(self, doc: Document, checksums: bool = True) -> list[str]:
        rows = sorted(self._rows(["idx", "kv_file", "checksum"], f"doc_path = {_quote(doc.path)}").to_pylist(),
                      key=lambda r: r["idx"])
        return chunk_problems(doc.n_chunks, [(r["idx"], r["kv_file"], r["checksum"]) for r in rows],
                              lambda name: KVFile(self._loc.path("kv", name), self._fs), checksums)

    @property
    def _fs(self):
        return self._loc.fs if self._loc.remote else None

    def document_writer(self, path: str, sha256: str, metadata: dict | None = None) -> "LanceDocumentWriter":
        return LanceDocumentWriter(self, path, sha256, metadata)

    def remove_document(self, path: str) -> None:
        """Drop one document's rows (one commit); its KV files go once they are orphans past the grace period."""
        self._require_writable()
        table = self._fresh()
        if table is None:
            return
        try:
            table.delete(f"doc_path = {_quote(path)}")
        except Exception as exc:  # noqa: BLE001
            raise self._loc.error(exc, "write to") from None

    def _require_writable(self):
        if not self.writable:
            raise StoreError(f"store {self.path} is open for reading; open it with Store.open_for_writing to change it")

    def _kv_listing(self) -> dict[str, dict]:
        """Every file in kv/ with its size and modification time (seconds since the epoch)."""
        try:
            entries = self._loc.fs.ls(self._loc.path("kv"), detail=True)
        except FileNotFoundError:
            return {}
        except Exception as exc:  # noqa: BLE001
            raise self._loc.error(exc, "list") from None
        listing = {}
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            modified = entry.get("LastModified") or entry.get("mtime") or entry.get("created") or 0
            if hasattr(modified, "timestamp"):
                modified = modified.timestamp()
            listing[name] = {"size": entry.get("size") or 0, "modified": float(modified)}
        return listing

    summary = _one_version(Store.summary)

    def _kv_sizes(self) -> dict[str, int]:
        return {name: e["size"] for name, e in self._kv_listing().items()}

    def _stored_bytes(self, documents: list[dict], sizes: dict[str, int]) -> int:
        """Its KV files (the manifest's tables are not counted)."""
        return sum(sizes.values())

    @_one_version
    def verify(self) -> dict:
        """As `Store.verify`; `manifest` is "ok" when the table reads, and `orphans` lists the KV files no row
        uses (of any age)."""
        try:
            self.num_chunks()
            manifest = "ok"
        except StoreError as exc:
            manifest = str(exc)
        documents = self.documents() if manifest == "ok" else []
        referenced = set(self._rows(["kv_file"]).column("kv_file").to_pylist()) if manifest == "ok" else set()
        on_disk = set(self._kv_listing())
        ours = {n for n in on_disk if _KV_NAME.fullmatch(n)}
        return self._verified(manifest, documents, referenced, on_disk, ours - referenced, on_disk - ours)

    def remove_orphans(self, older_than_s: float = ORPHAN_GRACE_S) -> list[str]:
        """Delete the KV files no row uses that were written more than `older_than_s` seconds ago; only files
        named as cagkit names KV files are considered. The names deleted."""
        self._require_writable()
        removed = []
        try:
            tables = self._connect().list_tables().tables
        except Exception as exc:  # noqa: BLE001
            raise self._loc.error(exc, "open") from None
        for name in tables:  # staging tables of `ingest --ray` runs that died before committing
            found = re.fullmatch(re.escape(STAGING_PREFIX) + r"(\d+)-[0-9a-f]+", name)
            if found and time.time() - int(found.group(1)) >= older_than_s:
                self._drop_table(name)
                removed.append(name)
        listing = self._kv_listing()
        if not listing:
            return removed
        referenced = set(self._rows(["kv_file"]).column("kv_file").to_pylist())
        now = time.time()
        for name, entry in sorted(listing.items()):
            if _KV_NAME.fullmatch(name) and name not in referenced and now - entry["modified"] >= older_than_s:
                try:
                    self._loc.fs.rm_file(self._loc.path("kv", name))
                except FileNotFoundError:
                    continue
                except Exception as exc:  # noqa: BLE001
                    raise self._loc.error(exc, "write to") from None
                removed.append(name)
        return removed

    # -- retrieval and loading -----------------------------------------------------------------------------

    @_one_version
    def search(self, query: np.ndarray, top_k: int, text: str | None = None, retrieval: str = "dense",
               documents: Iterable[str] | None = None) -> list[Hit]:
        """As `Store.search`. Over the whole store each ranking is LanceDB's (vector index or exact scan, and the
        full-text index), fused by reciprocal rank over their first `CANDIDATES` (or 10 x top_k) each; over
        `documents` their rows are ranked exactly as `Store` ranks them."""
        from cagkit.retrieval.lexical import LexicalIndex
        from cagkit.retrieval.rank import check_retrieval, rank

        check_retrieval(retrieval)
        table = self._fresh()
        if table is None or table.count_rows() == 0:
            raise no_documents(self.path)
        query = np.asarray(query, dtype=np.float32)
        columns = ["chunk_id", "doc_path", "idx", "text", "doc_metadata", "vector"]
        if documents is not None:
            paths = list(documents)
            rows = self._rows(columns + ["ingested_at"],
                              _in_paths(paths) if paths else "false")
            # in the order written, as `Store` keeps them, so that ties rank the same
            rows = rows.sort_by([("ingested_at", "ascending"), ("doc_path", "ascending"), ("idx", "ascending")])
            if rows.num_rows == 0:
                return []
            vectors = np.stack(rows.column("vector").to_numpy(zero_copy_only=False))
            best, scores = rank_chunks(vectors, query, text, retrieval, top_k,
                                       lambda: LexicalIndex(rows.column("text").to_pylist()))
            return [_hit(rows, int(i), float(s)) for i, s in zip(best, scores)]
        want = max(CANDIDATES, 10 * top_k)
        lists = []
        try:
            if retrieval != "lexical":
                search = table.search(query, vector_column_name="vector").distance_type("dot") \
                    .select(columns + ["_distance"])
                if any(i.name == "vector_idx" for i in table.list_indices()):
                    search = search.nprobes(NPROBES).refine_factor(REFINE_FACTOR)
                lists.append(search.limit(want).to_arrow())
            if retrieval != "dense":
                if text is None:
                    rank(np.zeros(0), None, retrieval, top_k)  # the error rank gives for a missing question
                from lancedb.query import MatchQuery

                lists.append(table.search(MatchQuery(text, "text"), query_type="fts")
                             .select(columns + ["_score"]).limit(want).to_arrow())
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._loc.error(exc, "search") from None
        return _fuse(lists, query, retrieval, top_k, want)

    def chunk_ids(self, path: str) -> list[int]:
        rows = self._rows(["chunk_id", "idx"], f"doc_path = {_quote(path)}").to_pylist()
        if not rows:
            raise StoreError(f"document {path} is not in store {self.path}")
        return [r["chunk_id"] for r in sorted(rows, key=lambda r: r["idx"])]

    def document_hits(self, path: str) -> list[Hit]:
        """Every chunk of one document as a `Hit` (score 0), in document order (`SQLiteStore.document_hits`)."""
        rows = self._rows(["chunk_id", "doc_path", "idx", "text", "doc_metadata"], f"doc_path = {_quote(path)}")
        order = sorted(range(rows.num_rows), key=lambda i: rows.column("idx")[i].as_py())
        return [_hit(rows, i, 0.0) for i in order]

    def token_ids(self, chunk_ids: list[int]) -> list[list[int]]:
        """Each chunk's source token ids, from the manifest (`SQLiteStore.token_ids`)."""
        if not chunk_ids:
            return []
        rows = self._rows(["chunk_id", "token_ids"], f"chunk_id IN ({', '.join(str(int(i)) for i in chunk_ids)})")
        found = {r["chunk_id"]: r["token_ids"] for r in rows.to_pylist()}
        missing = [i for i in chunk_ids if i not in found]
        if missing:
            raise ChunkGoneError(f"chunk {missing[0]} is no longer in store {self.path}; try again")
        return [found[i] for i in chunk_ids]

    def load_chunks(self, chunk_ids: list[int]) -> list[StoredChunk | StoreError]:
        """`Store.load_chunks` from one version of the manifest (one query), the KV files read side by side: on
        object storage each read is a request, and a question's chunks would otherwise wait for each other."""
        ids = [int(i) for i in chunk_ids]
        if not ids:
            return []
        rows = self._rows(["chunk_id", "doc_path", "kv_file", "idx", "text", "checksum"],
                          f"chunk_id IN ({', '.join(map(str, sorted(set(ids))))})")
        by_file: dict[str, list[tuple]] = {}
        for row in rows.to_pylist():
            by_file.setdefault(row["kv_file"], []).append(
                (row["chunk_id"], row["doc_path"], row["idx"], row["text"], row["checksum"]))

        def read(kv_file: str) -> list[StoredChunk | StoreError]:  # one header and one batch of ranges a file
            file = self._loc.path("kv", kv_file)
            return read_chunks(lambda: KVFile(file, self._fs), file, self.path, by_file[kv_file])

        files = list(by_file)
        if len(files) <= 1:
            results = [read(f) for f in files]
        else:
            with ThreadPoolExecutor(max_workers=min(len(files), PARALLEL_READS)) as pool:
                results = list(pool.map(read, files))
        found = {entry[0]: result for f, got in zip(files, results) for entry, result in zip(by_file[f], got)}
        return [found.get(i) or chunk_gone(i, self.path) for i in ids]

    # -- writing -------------------------------------------------------------------------------------------

    def _put_kv(self, name: str, tensors: dict, meta: dict, first: int, count: int) -> dict[int, str]:
        """Write a KV file under its content-hash name unless the file there holds exactly these tensors (another
        writer's, or an interrupted run's); its chunks' checksums."""
        from safetensors.torch import save

        indices = range(first, first + count)
        target = self._loc.path("kv", name)
        data = save(tensors, metadata=meta)
        want = chunk_checksums(data, indices, CHUNK_TENSORS)
        if chunk_checksums(target, indices, CHUNK_TENSORS, self._fs) != want:
            try:
                if self._loc.remote:
                    self._loc.fs.pipe_file(target, data)  # one PUT: all of the file or nothing
                else:
                    Path(target).parent.mkdir(parents=True, exist_ok=True)
                    with atomic_write(target) as tmp:
                        tmp.write_bytes(data)
            except Exception as exc:  # noqa: BLE001
                raise self._loc.error(exc, "write to") from None
            if chunk_checksums(target, indices, CHUNK_TENSORS, self._fs) != want:
                raise StoreError(f"KV file {target} does not read back as written; check store {self.path}")
        return want

    def commit_rows(self, rows: list[dict], replace: Iterable[str] = ()) -> None:
        """Commit manifest rows (`_schema`'s columns) in one LanceDB commit, dropping the older rows of every
        document in `replace` that the new rows do not overwrite. The KV files the rows name must be written."""
        self._require_writable()
        replace = list(dict.fromkeys(replace))
        paths = sorted({row["doc_path"] for row in rows})
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                if self._commit_once(rows, replace, paths):
                    return
            except StoreError:
                raise
            except Exception as exc:  # noqa: BLE001
                if attempt + 1 == COMMIT_ATTEMPTS or not _is_commit_conflict(exc):
                    raise self._loc.error(exc, "write to") from None
            time.sleep(0.2 * 2**attempt)  # another writer committed first: merge again on its version
        raise StoreError(f"store {self.path}: the rows of {', '.join(paths)} did not stay committed after "
                         f"{COMMIT_ATTEMPTS} tries (other writers keep replacing the manifest); run the ingest again")

    def _commit_once(self, rows: list[dict], replace: list[str], paths: list[str]) -> bool:
        """One try of `commit_rows`: True when the rows are committed and read back from the latest version.

        The read-back sees rows that another writer's creation of the table dropped (`_create_table`) before it
        restored them, and the caller merges them again."""
        table = self._fresh()
        if table is None:
            if not rows:
                return True
            table = self._create_table(len(rows[0]["vector"]))  # empty, then merged into like any table
        if not rows:
            if replace:
                table.delete(_in_paths(replace))
            return True
        self._upgrade(table)  # before rows that fill the added columns are cast to the table's schema
        import pyarrow as pa

        merge = table.merge_insert(["doc_path", "idx"]).when_matched_update_all().when_not_matched_insert_all()
        if replace:
            merge = merge.when_not_matched_by_source_delete(_in_paths(replace))
        merge.execute(pa.Table.from_pylist(rows, schema=table.schema))
        table.checkout_latest()
        # at least the rows just merged (a document written in parts holds its earlier parts' rows too)
        return table.count_rows(_in_paths(paths)) >= len(rows)

    def _create_table(self, dim: int):
        """Create the manifest's table, or open it if another writer has.

        Two writers that find no table can both create it, and Lance commits the later creation as an overwrite of
        every version before it (both creations succeed, at versions 1 and 2 or later), which would drop the rows
        the first writer has committed meanwhile, even after it read them back. So the writer whose creation landed
        above version 1 puts back, from the version just before its own, every document the latest version lacks
        (a document another writer removed in the instant between the two would come back too).
        """
        db = self._connect()
        try:
            table = self._table = db.create_table(TABLE, schema=_schema(dim), mode="create")
        except Exception as exc:  # noqa: BLE001 - LanceDB says so in a ValueError, Lance in other errors
            if "already exists" not in str(exc).lower():
                raise
            table = self._table = _open_table(self._loc)  # waits while the other writer's creation lands
            if table is None:
                raise
            return table
        if table.version > 1:
            before = db.open_table(TABLE)
            before.checkout(table.version - 1)
            present = set(self._rows(["doc_path"]).column("doc_path").to_pylist())
            lost = [row for row in before.to_arrow().to_pylist() if row["doc_path"] not in present]
            if lost:
                self.commit_rows(lost)
        return self._fresh()

    def _upgrade(self, table) -> None:
        """Add to `table` (None: none yet) the columns a table written before lacks (`_added_columns`), all null,
        which reads as before: the Lance store's equivalent of a numbered migration (module docstring). Another
        writer adding them at the same moment may win; then they are there, which is all that is needed."""
        if table is None:
            return
        missing = [f for f in _added_columns() if f.name not in table.schema.names]
        if not missing:
            return
        try:
            table.add_columns(missing)
        except Exception as exc:  # noqa: BLE001 - "already exists" or a commit conflict: another writer's add
            try:
                table.checkout_latest()
                done = all(f.name in table.schema.names for f in missing)
            except Exception:  # noqa: BLE001
                done = False
            if not done:
                raise self._loc.error(exc, "upgrade the manifest of") from None

    def _connect(self):
        if self._db is None:
            try:
                self._db = _lancedb().connect(self._loc.lance_uri(), storage_options=self._loc.storage_options())
            except Exception as exc:  # noqa: BLE001
                raise self._loc.error(exc, "open") from None
        return self._db

    def _index(self) -> None:
        """Bring the search indexes up to date: a full-text index on the text, scalar indexes on chunk ids and
        document paths and, above `VECTOR_INDEX_ROWS` chunks, an IVF_PQ vector index; rows added since are folded
        in by `optimize`. Another writer doing the same at the same moment may win: its index serves."""
        from lancedb.index import FTS, BTree, IvfPq

        table = self._fresh()
        try:
            names = {i.name for i in table.list_indices()}
            if "text_idx" not in names:  # English stop words out and stems in, for indexed rows and new ones alike
                table.create_index("text", config=FTS(lower_case=True, stem=True, remove_stop_words=True,
                                                      ascii_folding=True), name="text_idx")
            for column in ("chunk_id", "doc_path"):  # what loading a chunk and reading a document filter on
                if f"{column}_idx" not in names:
                    table.create_index(column, config=BTree(), name=f"{column}_idx")
            rows = table.count_rows()
            if "vector_idx" not in names and rows >= VECTOR_INDEX_ROWS:
                table.create_index("vector", config=IvfPq(distance_type="dot", num_sub_vectors=48,
                                                          num_partitions=max(1, round(rows ** 0.5))),
                                   name="vector_idx")
            elif names:
                table.optimize()
        except Exception as exc:  # noqa: BLE001 - a concurrent writer's commit; the next close retries
            warnings.warn(f"store {self.path}: the search index was not updated this time ({str(exc)[:120]}); "
                          f"searches stay correct, and the next ingest updates it", stacklevel=2)


class LanceDocumentWriter(BaseDocumentWriter):
    """`DocumentWriter` for a `LanceStore`: each `add` writes one content-addressed KV file, `commit` records every
    chunk of the document in one commit. Without `commit` nothing is recorded; the files written become orphans.

    As `DocumentWriter`, the first chunks added say how the document was prefilled (`prefill`, `window`): whole,
    each chunk's KV its slice of the document's cache (`NewChunk.context` set), or each chunk alone."""

    def __init__(self, store: LanceStore, path: str, sha256: str, metadata: dict | None = None):
        store._require_writable()
        super().__init__(store, path, sha256, metadata)
        self._parts: list[str] = []  # the KV file of each part added, in order

    def _name(self, token_ids: list[list[int]], contexts: list[tuple[int, ...] | None]) -> str:
        """The next part's KV file name: a document prefilled whole chains it to the part before."""
        return kv_file_name(self.store.settings, len(self._rows), token_ids, contexts,
                            before=self._parts[-1] if self._parts else None)

    @property
    def rows(self) -> list[dict]:
        """The rows of the chunks added so far, less their document's columns (`document_rows`)."""
        return list(self._rows)

    def stored(self, token_ids: list[list[int]], contexts: list[tuple[int, ...] | None] | None = None
               ) -> dict[int, str] | None:
        """The checksums of the next part's chunks (by their token ids and, prefilled in their document, their
        `NewChunk.context`) if a complete KV file of exactly that part is in the store already (an interrupted run
        wrote it), else None: then it must be prefilled and `add`ed. Files are only ever published whole (a
        rename, or one PUT), so a complete file is what a writer wrote."""
        first = len(self._rows)
        contexts = contexts if contexts is not None else [None] * len(token_ids)
        required = CHUNK_TENSORS + (("context",) if any(c is not None for c in contexts) else ())
        sums = chunk_checksums(self.store._loc.path("kv", self._name(token_ids, contexts)),
                               range(first, first + len(token_ids)), required, self.store._fs)
        return None if any(v is None for v in sums.values()) else sums

    def add_stored(self, chunks: list[NewChunk], embeddings: np.ndarray, sums: dict[int, str]) -> None:
        """Add the next part from a KV file `stored` found (`chunks` need no KV, but their context if they have
        one). A document prefilled whole reads on with `stored_kv`: the parts after this one attend to it."""
        self._begin_part(chunks)
        name = self._name([c.token_ids for c in chunks], [c.context for c in chunks])
        self._add_rows(chunks, embeddings, len(self._rows), name, sums)

    def stored_kv(self):
        """The RoPE-free KV [L, T, H, D] of the part added last, its chunks one after the other, read back from its
        file and checked against the checksums recorded for it (a `DamagedChunkError` if it changed since): what a
        document prefill resumed after that part feeds `cagkit.kv.prefill.DocumentPrefill.skip`."""
        import torch

        from cagkit.kv.chunk import ChunkKV

        if not self._parts:
            raise ValueError("no part has been added yet")
        name = self._parts[-1]
        file = self.store._loc.path("kv", name)
        kv = KVFile(file, self.store._fs)
        rows = [r for r in self._rows if r["kv_file"] == name]
        chunks = [read_chunk(lambda: kv, file, self.store.path, r["idx"], self.path, r["idx"], r["text"],
                             r["checksum"]).kv for r in rows]
        return ChunkKV(torch.cat([c.keys for c in chunks], 1), torch.cat([c.values for c in chunks], 1))

    def _write_part(self, chunks: list[NewChunk], tensors: dict, first: int) -> tuple[str, dict[int, str]]:
        name = self._name([c.token_ids for c in chunks], [c.context for c in chunks])
        return name, self.store._put_kv(name, tensors, self._file_metadata(first), first, len(chunks))

    def _add_rows(self, chunks: list[NewChunk], embeddings: np.ndarray, first: int, name: str,
                  sums: dict[int, str]) -> None:
        self._rows += [chunk_row(c, i, np.asarray(embeddings[i - first]), name, sums[i])
                       for i, c in enumerate(chunks, start=first)]
        self._parts.append(name)

    def commit(self) -> None:
        rows = document_rows(self.path, self.sha256, self.metadata, self._rows, self.prefill, self.window)
        self.store.commit_rows(rows, replace=[self.path])
        self._committed = True


def migrate(source: str | Path, target: str | Path, progress=None, dtype: str | None = None) -> dict:
    """Copy the SQLite store `source` into the LanceDB store `target` (a URL or a new local folder): every intact
    document with its KV as stored (no model runs), a KV file per part of the source's. `source` is only read.
    With `dtype` (e.g. int8 or int4), the copy holds its KV in that dtype instead, quantized from the stored KV as
    it is copied: a store compressed without prefilling its documents again. Documents `target` already holds
    unchanged are skipped, so an interrupted copy resumes. Returns the paths `copied`, `unchanged`, and `damaged`
    (left out: repair the source and migrate again)."""
    done = {"copied": [], "unchanged": [], "damaged": []}
    with Store.open(source) as src:
        if isinstance(src, LanceStore):
            raise StoreError(f"store {source} is a LanceDB store already; give the folder of a SQLite store as --store")
        settings = src.settings
        if dtype is not None and dtype != settings.dtype:
            check_dtype(dtype)
            if KV_DTYPES[dtype] > KV_DTYPES[settings.dtype]:
                raise StoreError(f"store {source} holds its KV in {settings.dtype}; a copy in {dtype} would take more "
                                 f"bytes for no more precision: give --dtype {settings.dtype} or a smaller one "
                                 f"(int8, int4), or ingest again with --dtype {dtype}")
            settings = dataclasses.replace(settings, dtype=dtype)
        with LanceStore.open_for_writing(target, settings) as dst:
            held = {d.path: d for d in dst.documents()}
            for doc in src.documents():
                old = held.get(doc.path)
                if (old is not None and old.sha256 == doc.sha256 and old.metadata == doc.metadata
                        and (old.prefill, old.window) == (doc.prefill, doc.window) and dst.is_intact(old)):
                    done["unchanged"].append(doc.path)
                    continue
                if not src.is_intact(doc, checksums=True):
                    done["damaged"].append(doc.path)
                    continue
                with dst.document_writer(doc.path, doc.sha256, doc.metadata or None) as writer:
                    part, vectors, part_file = [], [], None
                    for chunk_id, start, end, embedding, kv_file in src.chunk_rows(doc):
                        if part and kv_file != part_file:  # the source's parts stay parts
                            writer.add(part, np.stack(vectors))
                            part, vectors = [], []
                        stored = src.load_chunk(chunk_id)
                        part.append(NewChunk(stored.text, start, end, stored.token_ids,
                                             [tuple(o) for o in stored.offsets.tolist()], stored.kv, stored.sentences,
                                             stored.context))
                        vectors.append(embedding)
                        part_file = kv_file
                    if part:
                        writer.add(part, np.stack(vectors))
                    writer.commit()
                done["copied"].append(doc.path)
                if progress is not None:
                    progress(doc.path)
    return done


def chunk_row(c: NewChunk, idx: int, embedding: np.ndarray, kv_file: str, checksum: str) -> dict:
    """A chunk's manifest row, less the columns of its document (`document_rows` adds them)."""
    spans, vectors = c.sentences if c.sentences is not None else (np.zeros((0, 2)), np.zeros((0, 0)))
    return {"idx": idx, "text": c.text, "char_start": c.char_start, "char_end": c.char_end,
            "n_tokens": len(c.token_ids), "token_ids": [int(t) for t in c.token_ids],
            "offsets": [int(o) for pair in c.offsets for o in pair],
            "vector": np.asarray(embedding, dtype=np.float32).tolist(),
            "sentence_spans": np.asarray(spans, dtype=np.int32).reshape(-1).tolist(),
            "sentence_embeddings": np.asarray(vectors, dtype=np.float32).reshape(-1).tolist(),
            "kv_file": kv_file, "checksum": checksum}


def document_rows(path: str, sha256: str, metadata: dict | None, rows: list[dict], prefill: str = "chunks",
                  window: int | None = None) -> list[dict]:
    """`rows` (from `chunk_row`, in chunk order) completed with their document's columns; `prefill` and `window`
    as `Document`'s (`LanceDocumentWriter.prefill`, `.window`)."""
    now = time.time()
    tokens = sum(r["n_tokens"] for r in rows)
    meta = json.dumps(metadata) if metadata else None
    return [{**r, "chunk_id": _int_id(path, sha256, str(r["idx"])), "doc_path": path, "doc_sha": sha256,
             "doc_metadata": meta, "doc_chunks": len(rows), "doc_tokens": tokens, "doc_prefill": prefill,
             "doc_window": window, "ingested_at": now}
            for r in rows]


def _documents(rows) -> dict[str, Document]:
    docs: dict[str, Document] = {}
    first_file: dict[str, tuple[int, str]] = {}
    for r in rows.to_pylist():
        path = r["doc_path"]
        if path not in docs:  # a table written before has no doc_prefill: its documents' chunks were read alone
            docs[path] = Document(_int_id(path), path, r["doc_sha"], "", r["doc_chunks"], r["doc_tokens"],
                                  json.loads(r["doc_metadata"]) if r["doc_metadata"] else {},
                                  r.get("doc_prefill") or "chunks", r.get("doc_window"))
        if path not in first_file or r["idx"] < first_file[path][0]:
            first_file[path] = (r["idx"], r["kv_file"])
    return {p: dataclasses.replace(d, kv_file=first_file[p][1]) for p, d in docs.items()}


def _hit(rows, i: int, score: float) -> Hit:
    meta = rows.column("doc_metadata")[i].as_py()
    return Hit(rows.column("chunk_id")[i].as_py(), rows.column("doc_path")[i].as_py(), rows.column("idx")[i].as_py(),
               rows.column("text")[i].as_py(), score, json.loads(meta) if meta else {})


def rrf_scores(rankings: list[list[int]], missing_rank: int) -> dict[int, float]:
    """Reciprocal rank fusion of ranked id lists, each id scoring 1 / (RRF_K + 1 + rank) per list (rank
    `missing_rank` in a list that lacks it), summed and scaled as `cagkit.retrieval.rank` scales: 1 for an id
    first in every list of two."""
    from cagkit.retrieval.rank import RRF_K

    where = [{cid: r for r, cid in enumerate(ids)} for ids in rankings]
    every = dict.fromkeys(cid for ids in rankings for cid in ids)
    return {cid: (RRF_K + 1) / 2 * sum(1.0 / (RRF_K + 1 + ranks.get(cid, missing_rank)) for ranks in where)
            for cid in every}


def _fuse(lists, query: np.ndarray, retrieval: str, top_k: int, want: int) -> list[Hit]:
    """The best `top_k` of LanceDB's result lists: by cosine (dense), BM25 (lexical) or reciprocal rank (hybrid,
    a chunk missing from one list ranked just past its end), scored as `cagkit.retrieval.rank` scores."""
    import pyarrow as pa

    if retrieval == "dense":
        rows = lists[0]
        scores = np.stack(rows.column("vector").to_numpy(zero_copy_only=False)) @ query if rows.num_rows else []
    elif retrieval == "lexical":
        rows = lists[0]
        scores = np.asarray(rows.column("_score").to_numpy(), dtype=np.float64)
    else:
        columns = ["chunk_id", "doc_path", "idx", "text", "doc_metadata"]
        dense, lexical = lists
        if dense.num_rows:  # the vector index may order by approximate distance: rank by the true cosine
            cosine = np.stack(dense.column("vector").to_numpy(zero_copy_only=False)) @ query
            dense = dense.take(np.argsort(-cosine, kind="stable"))
        fused = rrf_scores([t.column("chunk_id").to_pylist() for t in (dense, lexical)], want)
        rows = pa.concat_tables([dense.select(columns), lexical.select(columns)])
        ids = rows.column("chunk_id").to_pylist()
        first = {}
        for i, cid in enumerate(ids):
            first.setdefault(cid, i)
        rows = rows.take(sorted(first.values()))
        scores = np.array([fused[cid] for cid in rows.column("chunk_id").to_pylist()])
    order = np.argsort(-np.asarray(scores), kind="stable")[:top_k]
    return [_hit(rows, int(i), float(scores[i])) for i in order]


def _in_paths(paths: Iterable[str]) -> str:
    """The LanceDB filter for rows of the documents `paths`."""
    return f"doc_path IN ({', '.join(map(_quote, paths))})"


def _is_commit_conflict(exc: Exception) -> bool:
    """Whether a LanceDB error is a commit that lost a race with another writer's (so trying again can land)."""
    text = str(exc).lower()
    return any(word in text for word in ("conflict", "incompatible transaction", "preempted"))


def _open_table(loc: _Location):
    """The manifest's table, or None before the first commit. A table that another writer is creating this moment
    is listed before it can be opened; it is waited for, briefly."""
    for attempt in range(COMMIT_ATTEMPTS):
        try:
            db = _lancedb().connect(loc.lance_uri(), storage_options=loc.storage_options())
            return db.open_table(TABLE) if TABLE in db.list_tables().tables else None
        except StoreError:
            raise
        except Exception as exc:  # noqa: BLE001
            if attempt + 1 == COMMIT_ATTEMPTS or "was not found" not in str(exc):
                raise loc.error(exc, "open") from None
        time.sleep(0.1 * 2**attempt)


def _read_settings(loc: _Location) -> StoreSettings | None:
    target = loc.path(SETTINGS_FILE)
    try:
        raw = loc.fs.cat_file(target)
    except FileNotFoundError as exc:
        if _no_such_bucket(exc):
            bucket = loc.root.split("/", 1)[0]
            raise StoreError(f"bucket {bucket} of store {loc.url} does not exist; check the URL and "
                             f"AWS_ENDPOINT_URL, or create the bucket (aws s3 mb s3://{bucket})") from None
        return None
    except Exception as exc:  # noqa: BLE001
        raise loc.error(exc, "open") from None
    damaged = StoreError(f"store {loc.url}: {SETTINGS_FILE} is damaged; move the store aside and re-run "
                         f"`cagkit ingest DOCS --store {loc.url}`")
    try:
        values = json.loads(raw)
    except ValueError:
        raise damaged from None
    return settings_from(values, loc.url, damaged)


def _no_such_bucket(exc: FileNotFoundError) -> bool:
    """Whether s3fs's FileNotFoundError is S3's NoSuchBucket (the bucket is missing, not a file in it)."""
    error = getattr(exc.__cause__, "response", None) or {}
    return error.get("Error", {}).get("Code") == "NoSuchBucket"


def _write_settings(loc: _Location, settings: StoreSettings) -> None:
    try:
        if loc.remote:
            loc.fs.pipe_file(loc.path(SETTINGS_FILE), json.dumps(settings.__dict__, indent=2).encode())
        else:
            Path(loc.root).mkdir(parents=True, exist_ok=True)
            write_json_atomic(Path(loc.root) / SETTINGS_FILE, settings.__dict__)
    except Exception as exc:  # noqa: BLE001
        raise loc.error(exc, "write to") from None
