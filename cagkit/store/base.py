"""What both kinds of store share: the `Store` interface and `open_store`, which picks the kind by location; the
settings, documents, chunks and hits they hold; their errors; and what they do alike: a part's KV-file tensors
(`chunk_tensors`), a document's checks (`chunk_problems`), reading and verifying chunks (`read_chunks`), the
summary, the report of `verify`, ranking a few documents' chunks, and the checks of a folder given as a store.

The two kinds are `cagkit.store.store.SQLiteStore` (a local folder with an SQLite manifest, one writer at a time)
and `cagkit.store.lance.LanceStore` (a URL such as `s3://bucket/prefix`, or a local folder with a LanceDB
manifest; several writers at once). Each subclass of `Store` names its `kind` and is listed in `Store.kinds` as its
module defines it; `cagkit.store` imports both, so that `open_store` knows them whichever module was imported.
This module imports neither: both import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Iterable

import numpy as np

from cagkit.config import KV_DTYPES
from cagkit.errors import StoreError
from cagkit.store.kvfile import DamagedFile, KVFile, to_torch

if TYPE_CHECKING:  # PyTorch is imported where KV is read or written, so `cagkit store info` starts at once
    import torch

    from cagkit.kv.chunk import ChunkKV

FORMAT_VERSION = 1
MANIFESTS = ("sqlite", "lance")  # what a store's manifest is: SQLite (one machine) or LanceDB (local or s3://)
CHUNK_TENSORS = ("keys", "values", "token_ids", "offsets")  # every chunk has these; sentences need an embedder


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
    prefill: str = "chunks"  # `document`: read whole, causally (each chunk's KV its slice); `chunks`: each alone
    window: int | None = None  # with `document`: the tokens one token attended over at most


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
    # how it was prefilled: (first token's index in the document, prefix tokens, window, sink) when its document
    # was read whole (`NewChunk.context`), None when it was prefilled alone
    context: tuple[int, int, int, int] | None = None

    @property
    def position(self) -> int | None:
        """Its first token's index among its document's tokens; None for a chunk prefilled alone."""
        return self.context[0] if self.context is not None else None


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
    # with document prefill: (first token's index in the document, prefix tokens, window, sink); None: alone
    context: tuple[int, int, int, int] | None = None


class DamagedManifestError(StoreError):
    """A store whose manifest SQLite cannot read."""


class ChunkGoneError(StoreError):
    """A chunk a search returned whose document another writer replaced or removed before the chunk was read."""


class StoreBusyError(StoreError):
    """A store that another process is writing, opened for writing without `wait`."""


class DamagedChunkError(StoreError):
    """A stored chunk whose KV file is missing, does not parse, or does not match the checksum recorded for it."""

    def __init__(self, message: str, doc_path: str, idx: int):
        super().__init__(message)
        self.doc_path = doc_path
        self.idx = idx


class Store:
    """A store of chunk KV caches, opened with `Store.open` (read) or `Store.open_for_writing` (both `open_store`).
    Each returns one of the two kinds, which answer the same methods: `SQLiteStore` (a local folder with an SQLite
    manifest, one writer at a time) or `cagkit.store.lance.LanceStore` (a URL such as `s3://bucket/prefix`, or a
    local folder with a LanceDB manifest; several writers at once). What they do alike is done here."""

    kind: str
    kinds: ClassVar[dict[str, type[Store]]] = {}  # each kind by its `kind`, as its module defines it
    path: str | Path
    settings: StoreSettings

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            Store.kinds[cls.kind] = cls

    @staticmethod
    def open(path: str | Path) -> Store:
        """Open an existing store for reading; a missing or foreign location is a StoreError."""
        return open_store(path)

    @staticmethod
    def open_for_writing(path: str | Path, settings: StoreSettings, wait: bool = False,
                         manifest: str = "sqlite") -> Store:
        """Create the store, or open it after checking it was built with the same `settings` (`open_store`)."""
        return open_store(path, write=True, settings=settings, wait=wait, manifest=manifest)

    # -- what each kind says of a location -----------------------------------------------------------------------

    @classmethod
    def is_at(cls, location: str | Path) -> bool:
        """Whether a store of this kind is at `location` (a URL is asked only of its settings)."""
        raise NotImplementedError

    @classmethod
    def takes(cls, location: str | Path) -> bool:
        """Whether `location` is this kind's to open: a store of this kind is there (or, a URL, can only be)."""
        return cls.is_at(location)

    @classmethod
    def check_folder(cls, path: Path) -> None:
        """Refuse a local `path` that cannot be or become a store of this kind (`check_store_folder`)."""
        raise NotImplementedError

    # -- what both kinds do alike --------------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    def documents(self) -> list[Document]:
        raise NotImplementedError

    def remove_document(self, path: str) -> None:
        raise NotImplementedError

    def prune(self, keep) -> list[str]:
        """Remove every document whose path `keep(path)` rejects (`ingest --prune`: its file is gone); their paths."""
        gone = [doc.path for doc in self.documents() if not keep(doc.path)]
        for path in gone:
            self.remove_document(path)
        return gone

    def kv_files(self, doc: Document) -> list[str]:
        """The names of the KV files (in `kv/`) that hold `doc`'s chunks, in chunk order."""
        raise NotImplementedError

    def check_document(self, doc: Document, checksums: bool = True) -> list[str]:
        """What is wrong with `doc`'s stored chunks, one line each; [] when nothing is. Without `checksums` only
        the files' headers are read (cheap), so changed tensor bytes go unnoticed."""
        raise NotImplementedError

    def is_intact(self, doc: Document, checksums: bool = False) -> bool:
        """True when every chunk the manifest lists for `doc` is in a KV file that opens, with all its tensors and
        a recorded checksum; with `checksums` its tensors' bytes are read and must match that checksum too."""
        return not self.check_document(doc, checksums)

    def document_writer(self, path: str, sha256: str, metadata: dict | None = None) -> BaseDocumentWriter:
        raise NotImplementedError

    def write_document(
        self, path: str, sha256: str, chunks: list[NewChunk], embeddings: np.ndarray, metadata: dict | None = None
    ) -> None:
        """Add or replace one document: its KV file first, then its manifest rows (one transaction or commit).

        `metadata` (JSON-serialisable) is kept with the document and returned with every Hit of its chunks.
        """
        with self.document_writer(path, sha256, metadata) as writer:
            writer.add(chunks, embeddings)
            writer.commit()

    def summary(self, checksums: bool = True) -> dict:
        """What the store holds, for people and scripts (`cagkit store info`): its settings, totals and, per
        document, chunks, tokens, KV bytes on disk and state: `ok` or `damaged` (re-ingest it). The state is the
        one `verify` gives the document: every chunk's tensors are read and checked against their checksum;
        without `checksums` only the KV files' headers are read (quick on a big store, but tensor bytes changed
        under an intact header go unnoticed)."""
        sizes = self._kv_sizes()
        documents = []
        for doc in self.documents():
            state = "ok" if self.is_intact(doc, checksums) else "damaged"
            documents.append({"path": doc.path, "chunks": doc.n_chunks, "tokens": doc.n_tokens,
                              "kv_bytes": sum(sizes.get(f, 0) for f in self.kv_files(doc)),
                              "state": state, "prefill": doc.prefill, "window": doc.window,
                              "metadata": doc.metadata})
        return summary_of(str(self.path), self.settings, documents, self._stored_bytes(documents, sizes))

    def _kv_sizes(self) -> dict[str, int]:
        """Each KV file's size in bytes, by name."""
        raise NotImplementedError

    def _stored_bytes(self, documents: list[dict], sizes: dict[str, int]) -> int:
        """The store's bytes on disk, from `summary`'s per-document entries and `_kv_sizes`."""
        raise NotImplementedError

    def _verified(self, manifest: str, documents: Iterable[Document], referenced: set[str], on_disk: set[str],
                  orphans: Iterable[str], foreign: Iterable[str]) -> dict:
        """`verify`'s report: `manifest` ("ok" or what is wrong with it), `documents` each checked (`check_document`)
        and the KV files the manifest names (`referenced`), those in kv/ (`on_disk`), and of those the ones cagkit
        wrote that no document uses (`orphans`) and the ones it did not write (`foreign`)."""
        states = []
        for doc in documents:
            problems = self.check_document(doc)
            states.append({"path": doc.path, "state": "damaged" if problems else "ok", "problems": problems})
        damaged = [d["path"] for d in states if d["state"] != "ok"]
        return {"store": str(self.path), "ok": manifest == "ok" and not damaged, "manifest": manifest,
                "documents": states, "damaged": damaged, "orphans": sorted(orphans),
                "missing": sorted(referenced - on_disk), "foreign": sorted(foreign)}

    def load_chunk(self, chunk_id: int) -> StoredChunk:
        """A chunk's text and KV, its tensors read alone from its KV file and checked against the checksum
        recorded when they were written; a `DamagedChunkError` names the document and how to rebuild it."""
        (result,) = self.load_chunks([chunk_id])
        if isinstance(result, StoreError):
            raise result
        return result

    def load_chunks(self, chunk_ids: list[int]) -> list[StoredChunk | StoreError]:
        """`load_chunk` of each id, in order, with the error in place of a chunk that cannot be read (a
        `DamagedChunkError`, or a `ChunkGoneError` when its document was replaced since the id was found)."""
        raise NotImplementedError


class BaseDocumentWriter:
    """What the document writers of both kinds share (`cagkit.store.store.DocumentWriter`, `cagkit.store.lance.
    LanceDocumentWriter`): `add` writes the next part of a document's chunks as one KV file, as they are prefilled,
    and `commit` records the document with every chunk added; leaving the `with` block without `commit` calls
    `abort`. The first chunks added say how the document was prefilled (`prefill`, `window`): whole, each chunk's
    KV its slice of the document's cache (`NewChunk.context` set), or each chunk alone."""

    def __init__(self, store: Store, path: str, sha256: str, metadata: dict | None = None):
        self.store = store
        self.path = path
        self.sha256 = sha256
        self.metadata = metadata
        self._rows: list = []
        self._committed = False
        self.prefill, self.window = "chunks", None  # set by the first chunks added (`NewChunk.context`)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if not self._committed:
            self.abort()

    @property
    def chunks(self) -> int:
        return len(self._rows)

    def add(self, chunks: list[NewChunk], embeddings: np.ndarray) -> None:
        """Write the next `chunks` of the document (and their unit embeddings [N, E]) as one KV file."""
        if not chunks:
            return
        self._begin_part(chunks)
        first = len(self._rows)
        tensors = chunk_tensors(chunks, first, self.store.settings.dtype)
        name, sums = self._write_part(chunks, tensors, first)
        del tensors
        self._add_rows(chunks, embeddings, first, name, sums)

    def _begin_part(self, chunks: list[NewChunk]) -> None:
        if not self._rows and chunks[0].context is not None:
            self.prefill, self.window = "document", int(chunks[0].context[2])

    def _file_metadata(self, first: int, **more: str) -> dict:
        """The safetensors metadata of a KV file whose first chunk is `first`."""
        settings = self.store.settings
        return {"format_version": str(FORMAT_VERSION), "source_fingerprint": settings.source_fingerprint,
                "dtype": settings.dtype, **more, "first_chunk": str(first)}

    def _write_part(self, chunks: list[NewChunk], tensors: dict, first: int) -> tuple[str, dict[int, str]]:
        """Write a part's KV file; its name and its chunks' checksums."""
        raise NotImplementedError

    def _add_rows(self, chunks: list[NewChunk], embeddings: np.ndarray, first: int, name: str,
                  sums: dict[int, str]) -> None:
        """Keep the rows of a part's chunks, in file `name` with checksums `sums`, for `commit`."""
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Undo what an uncommitted writer did, where its kind needs that."""


# -- opening -----------------------------------------------------------------------------------------------------

def is_url(location: str | Path) -> bool:
    """Whether `location` names a store by URL (`s3://...`) rather than a local path."""
    return isinstance(location, str) and re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", location) is not None \
        and not location.startswith("file://")


def open_store(location: str | Path, *, write: bool = False, settings: StoreSettings | None = None,
               wait: bool = False, manifest: str = "sqlite") -> Store:
    """Open the store at `location`, of the kind it holds: a local folder with an SQLite manifest, a local folder
    with a LanceDB manifest, or a URL (`s3://...`, always LanceDB). Where there is no store yet, `manifest` says
    which kind to create (`MANIFESTS`).

    Reading (the default), a missing or foreign location is a StoreError. With `write`, the store is created, or
    opened after checking it was built with the same `settings`; `wait`: wait for another process's writer (an
    SQLite store has one writer at a time; a LanceDB store several, so there is nothing to wait for)."""
    if manifest not in MANIFESTS:
        raise StoreError(f"manifest must be one of {', '.join(MANIFESTS)}, got {manifest!r}")
    kind = next((k for k in Store.kinds.values() if k.takes(location)), None) or Store.kinds[manifest]
    if not write:
        return kind.open(location)
    if settings is None:
        raise ValueError("open_store(write=True) needs the store's settings")
    return kind.open_for_writing(location, settings, wait=wait)


def is_store(location: str | Path) -> bool:
    """Whether `location` already holds a cagkit store of either kind (a URL is asked only of its settings)."""
    return any(kind.is_at(location) for kind in Store.kinds.values())


def check_location(location: str | Path, manifest: str = "sqlite") -> None:
    """Refuse a local `location` that cannot be or become a store: a file, or a folder with other things in it
    that holds no store of either kind (a URL is checked when it is opened). `cagkit serve` checks its --store
    with it before it listens, as the other commands refuse such a --store when they open it."""
    if not is_url(location) and not is_store(location):
        Store.kinds[manifest].check_folder(Path(location))


def check_store_folder(path: Path, marker: str, own: tuple[str, ...] = ()) -> None:
    """Refuse a --store that is a file, or a folder with other things in it that is not a store (has no `marker`,
    the file a store of its kind is known by). `own` names what such a store may hold before its marker: those
    files, and an empty kv/ folder where "kv" is among them."""
    if path.exists() and not path.is_dir():
        raise StoreError(f"store {path} is a file, not a folder; give a new folder or a cagkit store's folder as --store")
    if not path.is_dir() or (path / marker).exists():
        return
    kv = path / "kv"
    others = sorted(p.name for p in path.iterdir() if p.name not in own)
    if others or ("kv" in own and kv.exists() and (not kv.is_dir() or any(kv.iterdir()))):
        raise StoreError(f"{path} is not empty and is not a cagkit store (no {marker}); give a new or empty "
                         f"folder as --store, or the folder of an existing store")


def settings_from(values, location: str | Path, damaged: StoreError) -> StoreSettings:
    """The settings a store's manifest records (`values`, as read from it); a StoreError for a store of another
    format version, and `damaged` where they are not settings at all."""
    if not isinstance(values, dict):
        raise damaged
    if values.get("format_version") != FORMAT_VERSION:
        raise StoreError(f"store {location} has format version {values.get('format_version')}, this cagkit reads "
                         f"{FORMAT_VERSION}; ingest the documents into a new store")
    try:
        return StoreSettings(**values)
    except TypeError:
        raise damaged from None


def check_compatible(path: str | Path, have: StoreSettings, want: StoreSettings) -> None:
    """Refuse to add to a store built with other settings than `want` (`have`: the store's)."""
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


def check_dtype(dtype: str) -> str:
    """`dtype` if a store can hold KV in it, else a StoreError that lists the ones it can."""
    if dtype not in KV_DTYPES:
        raise StoreError(f"KV dtype {dtype!r} is not one a store holds; use one of {', '.join(KV_DTYPES)}")
    return dtype


# -- what both kinds do alike --------------------------------------------------------------------------------------

def chunk_gone(chunk_id: int, store) -> ChunkGoneError:
    return ChunkGoneError(f"chunk {chunk_id} is not in store {store}: its document was replaced or removed since the "
                          f"chunk was found; try again")


def no_documents(store) -> StoreError:
    """The error of a search in a store that holds nothing yet."""
    return StoreError(f"store {store} holds no documents; add some with `cagkit ingest DOCS --store {store}`")


def rank_chunks(vectors: np.ndarray, query: np.ndarray, text: str | None, retrieval: str, top_k: int,
                lexical: Callable[[], object]) -> tuple[np.ndarray, np.ndarray]:
    """The positions among chunks with unit embeddings `vectors` [N, E] of the `top_k` best for the question
    (embedding `query` [E], `text`), and their scores, by `cagkit.retrieval.rank`; `lexical()` gives the chunks'
    `LexicalIndex`, asked for only where `retrieval` needs it."""
    from cagkit.retrieval.rank import rank  # rank refuses an unknown retrieval

    dense = vectors @ np.asarray(query, dtype=np.float32)  # [N]
    scores = lexical().scores(text) if retrieval != "dense" and text is not None else None
    return rank(dense, scores, retrieval, top_k)


def chunk_tensors(chunks: list[NewChunk], first: int, dtype: str) -> dict:
    """The KV-file tensors of `chunks`, numbered from `first`: per chunk `{i}.keys` and `{i}.values` [L, T, H, D]
    in `dtype` (int8 and int4: their codes, with scales beside them, as `cagkit.kv.quant` names them), `{i}.token_ids` [T] and `{i}.offsets` [T, 2] int32, and its sentences where it has them."""
    import torch

    from cagkit.kv import quant

    check_dtype(dtype)
    tensors = {}
    for i, c in enumerate(chunks, start=first):
        if quant.is_quantized(dtype):
            tensors.update({f"{i}.{name}": t for name, t in quant.quantize(c.kv.keys, c.kv.values, dtype).items()})
        else:
            tensors[f"{i}.keys"] = c.kv.keys.to(device="cpu", dtype=getattr(torch, dtype)).contiguous()
            tensors[f"{i}.values"] = c.kv.values.to(device="cpu", dtype=getattr(torch, dtype)).contiguous()
        tensors[f"{i}.token_ids"] = torch.tensor(c.token_ids, dtype=torch.int32)
        tensors[f"{i}.offsets"] = torch.tensor(c.offsets, dtype=torch.int32).reshape(-1, 2)
        if c.sentences is not None:
            tensors.update(sentence_tensors(i, c.sentences))
        if c.context is not None:
            tensors[f"{i}.context"] = torch.tensor(c.context, dtype=torch.int32)
    return tensors


def sentence_tensors(index: int, sentences: tuple) -> dict:
    """The KV-file tensors of chunk `index`'s sentence spans [S, 2] int32 and embeddings [S, E] float16."""
    import torch

    spans, vectors = sentences
    return {f"{index}.sentences": torch.as_tensor(spans, dtype=torch.int32).reshape(-1, 2),
            f"{index}.sentence_embeddings": torch.as_tensor(vectors).to(torch.float16)}


def summary_of(location: str, settings: StoreSettings, documents: list[dict], total_bytes: int) -> dict:
    """A store's summary from its per-document entries: totals, and the KV bytes on disk per stored token (KV
    files hold each chunk's tokens, offsets and sentences beside its keys and values)."""
    tokens = sum(d["tokens"] for d in documents)
    kv_bytes = sum(d["kv_bytes"] for d in documents)
    return {"store": location, "settings": dict(settings.__dict__), "documents": len(documents),
            "chunks": sum(d["chunks"] for d in documents), "tokens": tokens, "bytes": total_bytes,
            "kv_bytes_per_token": round(kv_bytes / tokens, 1) if tokens else None, "per_document": documents}


def chunk_problems(n_chunks: int, rows, open_file, checksums: bool) -> list[str]:
    """What is wrong with a document's stored chunks, one line each: `rows` are its (idx, KV file, checksum) in
    chunk order, `open_file(name)` a `KVFile`. Without `checksums` only the files' headers are read."""
    problems = []
    if [r[0] for r in rows] != list(range(n_chunks)):
        problems.append(f"the manifest lists {len(rows)} chunks of {n_chunks}")
    files: dict[str, KVFile | str] = {}
    for idx, kv_file, checksum in rows:
        if kv_file is None or checksum is None:
            problems.append(f"chunk {idx}: no checksum recorded (its KV file was damaged when checksums were added)")
            continue
        if kv_file not in files:
            try:
                files[kv_file] = open_file(kv_file)
            except DamagedFile as exc:
                files[kv_file] = str(exc)
        file = files[kv_file]
        if isinstance(file, str):
            problems.append(f"chunk {idx}: KV file {kv_file} is {file}" if file == "missing"
                            else f"chunk {idx}: KV file {kv_file} does not parse ({file})")
            continue
        missing = [t for t in CHUNK_TENSORS if f"{idx}.{t}" not in file.tensors]
        if missing:
            problems.append(f"chunk {idx}: KV file {kv_file} lacks its {', '.join(missing)}")
        elif checksums:
            try:
                if file.checksum(idx, like=checksum) != checksum:
                    problems.append(f"chunk {idx}: its tensors in KV file {kv_file} do not match their checksum")
            except DamagedFile as exc:
                problems.append(f"chunk {idx}: KV file {kv_file}: {exc}")
    return problems


def read_chunk(open_file, file_label, store, chunk_id: int, doc_path: str, idx: int, text: str,
               checksum: str | None) -> StoredChunk:
    """Chunk `idx` of the KV file `open_file()` opens, checked against `checksum` (None: none was recorded), as a
    `StoredChunk`; a `DamagedChunkError` names `file_label`, the document and how to rebuild it."""
    (result,) = read_chunks(open_file, file_label, store, [(chunk_id, doc_path, idx, text, checksum)])
    if isinstance(result, DamagedChunkError):
        raise result
    return result


def read_chunks(open_file, file_label, store, entries: list[tuple]) -> list[StoredChunk | DamagedChunkError]:
    """`read_chunk` of each (chunk_id, doc_path, idx, text, checksum) of `entries`, all in the KV file that
    `open_file()` opens: its header read once and the chunks' tensors in one read (on object storage, one batch of
    range requests). Int8 and int4 KV is dequantized here, as it is placed."""
    from cagkit.kv.chunk import ChunkKV
    from cagkit.kv.quant import dequantize

    try:
        read = open_file().read_chunks([e[2] for e in entries if e[4] is not None], {e[2]: e[4] for e in entries})
    except DamagedFile as exc:
        read = {e[2]: exc for e in entries}
    out: list[StoredChunk | DamagedChunkError] = []
    for chunk_id, doc_path, idx, text, checksum in entries:
        try:
            if checksum is None:
                raise DamagedFile("no checksum was recorded for it")
            if isinstance(read[idx], DamagedFile):
                raise read[idx]
            tensors, actual = read[idx]
            missing = [t for t in CHUNK_TENSORS if f"{idx}.{t}" not in tensors]
            if missing:
                raise DamagedFile(f"chunk {idx} lacks its {', '.join(missing)}")
            if actual != checksum:
                raise DamagedFile(f"chunk {idx} does not match its checksum")
        except DamagedFile as exc:
            out.append(DamagedChunkError(
                f"KV file {file_label} of document {doc_path} is damaged ({exc}); run `cagkit store repair --store "
                f"{store}` or `cagkit ingest {doc_path} --store {store}` to rebuild it", doc_path, idx))
            continue
        t = {name.split(".", 1)[1]: to_torch(*value) for name, value in tensors.items()}
        sentences = None
        if "sentences" in t:
            sentences = (t["sentences"].numpy(), t["sentence_embeddings"].float().numpy())
        context = tuple(int(x) for x in t["context"].tolist()) if "context" in t else None
        kv = ChunkKV(*dequantize(t)) if "quant" in t else ChunkKV(t["keys"], t["values"])
        out.append(StoredChunk(chunk_id, doc_path, idx, text, t["token_ids"].tolist(), t["offsets"], kv, sentences,
                               context))
    return out
