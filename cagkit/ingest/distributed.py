"""`cagkit ingest --ray`: the same ingest on a Ray cluster, into a LanceDB store (a URL, or a local folder).

    driver        opens the store (its settings, what it already holds), lists the files
    Ray Data      reads each file and hashes its text (tasks); unchanged documents stop here, and what became of
                  every file (new, unchanged, unreadable) is known before any prefill starts
    actor pool    each actor loads the source model and the embedder once, takes a new document's text as the
                  read found it (a file is read once; the stored hash is that of the stored text), chunks it
                  (tokenising each chunk once), and for each part
                  of `PART_TOKENS` tokens writes its KV file to the store (named by content, so a part written by
                  an earlier, interrupted run is found and not prefilled again) and returns the part's rows.
                  With `prefill="document"` (the default, as for `ingest`) one actor reads a whole document, its
                  parts in order through one `DocumentPrefill` (`cagkit.ingest.pipeline.DocumentReading`), each
                  attending to the document before it; a part an interrupted run wrote is read back from its
                  file into the window (`DocumentPrefill.skip`) instead of being prefilled again
    lance-ray     writes the rows, from the actors' blocks, to a staging table of this run beside the manifest
    driver        commits the staged rows into the manifest a batch of documents at a time (each document whole,
                  replacing its older version in the same commit), then drops the staging table

A run killed at any moment leaves the manifest as it was before the batch being committed, and nothing a reader
can see points at a missing file; the next run redoes the documents not committed, reusing their KV files.
One GPU per actor where the cluster has GPUs. Needs the scale extra: `pip install 'cagkit[scale]'`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import time
import warnings
from pathlib import Path

from cagkit.config import DEFAULT_CHUNK_TOKENS, DEFAULT_PREFILL, DEFAULT_SOURCE
from cagkit.errors import CagkitError, DocumentError, SkippedDocumentWarning, StoreError
from cagkit.ingest.documents import document_path, find_documents, read_document
from cagkit.ingest.pipeline import (
    PART_TOKENS,
    DocumentReading,
    IngestReport,
    _parts,
    _still_there,
    _token_ends,
    check_prefill,
    prefill_chunks,
)
from cagkit.store.store import NewChunk, Store, StoreSettings, check_dtype

COMMIT_DOCUMENTS = 64  # documents per manifest commit


def ingest_ray(
    paths: list[str | Path],
    store: str | Path,
    address: str | None = None,
    actors: int = 2,
    source: str = DEFAULT_SOURCE,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    dtype: str = "float16",
    prune: bool = False,
    device: str | None = None,
    progress: bool = True,
    prefill: str = DEFAULT_PREFILL,
    window: int | None = None,
) -> IngestReport:
    """Add the documents under `paths` to the LanceDB store `store` (a URL, a local LanceDB store, or a new
    folder, which becomes one) with Ray: `address` is a running cluster's (`ray://host:10001` or `auto`); None
    starts a local Ray for this run. `actors` source models prefill at once, a document each; the other arguments
    (`prefill` and `window` among them) are `ingest`'s.

    The files are read where Ray runs its tasks: on a cluster, give paths every node can read (a shared file
    system). Unchanged documents (same content hash, KV files whose headers are whole) are skipped."""
    try:
        import lance_ray
        import ray
        from ray.data.expressions import col
    except ImportError:
        raise CagkitError("cagkit ingest --ray needs the scale extra: pip install 'cagkit[scale]'") from None
    from cagkit.models.loading import load_model
    from cagkit.retrieval.embeddings import EMBEDDER_NAME
    from cagkit.store import lance

    if actors < 1:
        raise CagkitError(f"--actors must be at least 1, got {actors}")
    check_dtype(dtype)
    check_prefill(prefill, window)
    files = [document_path(f) for f in find_documents(paths)]
    lm = load_model(source, "cpu")  # the settings need its fingerprint; the actors load their own
    if prefill == "document":
        DocumentReading.of(lm, chunk_tokens, window)  # a window too small for the chunks: an error before Ray starts
    settings = StoreSettings(source=lm.name, source_fingerprint=lm.fingerprint, dtype=dtype,
                             chunk_tokens=chunk_tokens, embedder=EMBEDDER_NAME)
    started = time.perf_counter()
    report = IngestReport()
    with Store.open_for_writing(store, settings, manifest="lance") as st:
        if not isinstance(st, lance.LanceStore):
            raise StoreError(f"store {store} keeps its manifest in SQLite, which one machine writes; ingest into a "
                             f"LanceDB store (a URL or a new folder), or copy this one with `cagkit store migrate`")
        report.orphans = st.removed
        known = {d.path: d for d in st.documents()}
        unchanged = {p: d.sha256 for p, d in known.items() if st.is_intact(d)}
        staging = f"{lance.STAGING_PREFIX}{int(time.time())}-{secrets.token_hex(3)}"
        if files:
            context = ray.init(address=address, **({} if address else _local_ray(actors))) \
                if not ray.is_initialized() else None
            try:
                data_context = ray.data.DataContext.get_current()
                data_context.enable_progress_bars = progress
                data_context.print_on_execution_start = progress
                read = ray.data.from_items([{"path": f} for f in files], override_num_blocks=min(len(files), 64))
                # one row per file, kept: the statuses are read from it, and the prefill takes the new documents'
                # text from it (only theirs is kept), so no file is read twice
                checked = read.map(_check, fn_kwargs={"unchanged": unchanged}, num_cpus=0.25).materialize()
                statuses = checked.select_columns(["path", "status", "reason"]).take_all()
                if any(row["status"] == "new" for row in statuses):
                    rows = checked.filter(expr=col("status") == "new").map_batches(
                        _Prefiller, fn_constructor_kwargs={"store": str(st.path), "source": source,
                                                           "settings": settings, "device": device,
                                                           "prefill": prefill, "window": window},
                        batch_size=1, compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=1,
                        num_gpus=_gpus_per_actor(ray), batch_format="pyarrow")
                    lance_ray.write_lance(rows, st.staging_uri(staging), schema=lance.staging_schema(),
                                          mode="create", storage_options=st.storage_options())
            finally:
                if context is not None:
                    ray.shutdown()
            for row in statuses:
                if row["status"] == "unchanged":
                    report.unchanged.append(row["path"])
                elif row["status"] == "failed":
                    warnings.warn(row["reason"], SkippedDocumentWarning, stacklevel=2)
                    report.failed.append((row["path"], row["reason"]))
            committed = st.commit_staged(staging, COMMIT_DOCUMENTS)
            for path, chunks, tokens in committed:
                (report.updated if path in known else report.added).append(path)
                report.chunks += chunks
                report.tokens += tokens
            stored = {path for path, _, _ in committed}
            for row in statuses:  # checked as new, but no rows came back for it (its warning stays in Ray's log)
                if row["status"] == "new" and row["path"] not in stored:
                    reason = (f"{row['path']}: could not be read when its prefill began (changed or removed since it "
                              f"was checked); run the ingest again")
                    warnings.warn(reason, SkippedDocumentWarning, stacklevel=2)
                    report.failed.append((row["path"], reason))
        if prune:
            report.removed += st.prune(_still_there)
    report.seconds = time.perf_counter() - started
    return report


def _local_ray(actors: int) -> dict:
    """A local Ray for one run: a CPU slot per actor and one for reading files and writing rows (at least the
    machine's cores), no dashboard, a modest object store."""
    return {"num_cpus": max(os.cpu_count() or 1, actors + 1), "include_dashboard": False,
            "object_store_memory": 512 << 20, "log_to_driver": False, "logging_level": logging.WARNING}


def _gpus_per_actor(ray) -> float:
    return 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0


def _check(row: dict, unchanged: dict[str, str]) -> dict:
    """What becomes of a file: `status` `unchanged` (its text hashes as stored), `failed` (with the reason) or
    `new`. A new document keeps its `text`, which the actor that prefills it takes: the file is read once."""
    path = row["path"]
    try:
        text = read_document(Path(path))
    except DocumentError as exc:
        return {"path": path, "status": "failed", "reason": str(exc), "text": ""}
    if unchanged.get(path) == _sha(text):
        return {"path": path, "status": "unchanged", "reason": "", "text": ""}
    return {"path": path, "status": "new", "reason": "", "text": text}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Prefiller:
    """A Ray actor: the source model and the embedder, loaded once; a document in, its manifest rows out."""

    def __init__(self, store: str, source: str, settings: StoreSettings, device: str | None,
                 prefill: str = DEFAULT_PREFILL, window: int | None = None):
        from cagkit.kv.rope import RotaryTables
        from cagkit.models.loading import load_model
        from cagkit.store import lance

        self.lm = load_model(source, device)
        if self.lm.fingerprint != settings.source_fingerprint:
            raise StoreError(f"the source model {source} on this Ray worker is not the one the driver loaded "
                             f"(fingerprint {self.lm.fingerprint}, not {settings.source_fingerprint}); install the "
                             f"same model on every node")
        self.tables = RotaryTables(self.lm.model)
        self.store = lance.LanceStore.for_workers(store, settings)
        self.settings = settings
        self.reading = DocumentReading.of(self.lm, settings.chunk_tokens, window) if prefill == "document" else None

    def __call__(self, batch):
        import pyarrow as pa

        from cagkit.ingest.chunking import chunk_text
        from cagkit.store import lance

        out = []
        for path, text in self._texts(batch):
            sha = _sha(text)
            chunks = chunk_text(text, self.lm.count_tokens, self.settings.chunk_tokens,
                                token_ends=_token_ends(self.lm))
            writer = self.store.document_writer(path, sha)
            if self.reading is not None:
                self._read_whole(writer, self.reading.tokens(self.lm, text, chunks))
            else:
                self._read_alone(writer, chunks)
            out += lance.document_rows(path, sha, None, writer.rows, writer.prefill, writer.window)
        return pa.Table.from_pylist(out, schema=lance.staging_schema())

    @staticmethod
    def _texts(batch):
        """(path, text) of each document of `batch`: the text `_check` read, or, in a batch of paths alone, the
        file read now (a file gone or unreadable since is left out with a warning)."""
        paths = batch.column("path").to_pylist()
        texts = batch.column("text").to_pylist() if "text" in batch.column_names else [None] * len(paths)
        for path, text in zip(paths, texts):
            if text is None:
                try:
                    text = read_document(Path(path))
                except DocumentError as exc:
                    warnings.warn(str(exc), SkippedDocumentWarning, stacklevel=2)
                    continue
            yield path, text

    def _read_alone(self, writer, chunks) -> None:
        """Each chunk prefilled alone (`prefill="chunks"`), a part at a time; each chunk tokenised once."""
        from cagkit.retrieval.embeddings import embed_with_sentences

        encoded = [self.lm.tokenizer(c.text, add_special_tokens=False, return_offsets_mapping=True) for c in chunks]
        done = 0
        for part, _ in _parts(chunks, [len(e["input_ids"]) for e in encoded], PART_TOKENS):
            ids, done = encoded[done:done + len(part)], done + len(part)
            vectors, sentences = embed_with_sentences([c.text for c in part])
            stored = writer.stored([e["input_ids"] for e in ids])
            if stored is not None:  # written by an earlier run that did not commit: no prefill
                new = [NewChunk(c.text, c.char_start, c.char_end, e["input_ids"],
                                [tuple(o) for o in e["offset_mapping"]], kv=None, sentences=s)
                       for c, e, s in zip(part, ids, sentences)]
                writer.add_stored(new, vectors, stored)
                continue
            new = prefill_chunks(self.lm, self.tables, part, encoded=ids)
            for chunk, kept in zip(new, sentences):
                chunk.sentences = kept
            writer.add(new, vectors)

    def _read_whole(self, writer, chunks) -> None:
        """The document read whole (`prefill="document"`), its parts in order through one `DocumentPrefill`; a part
        an earlier, interrupted run wrote is not prefilled again, but its KV, read back, enters the window."""
        from cagkit.retrieval.embeddings import embed_with_sentences

        reader = self.reading.start(self.lm, self.tables)
        budget = min(PART_TOKENS, self.reading.part_tokens)
        for part, _ in _parts(chunks, [len(c.token_ids) for c in chunks], budget):
            vectors, sentences = embed_with_sentences([c.text for c in part])
            contexts = [self.reading.context(c.position) for c in part]
            stored = writer.stored([c.token_ids for c in part], contexts)
            if stored is not None:
                new = [NewChunk(c.text, c.char_start, c.char_end, c.token_ids, c.offsets, kv=None, sentences=s,
                                context=x) for c, s, x in zip(part, sentences, contexts)]
                writer.add_stored(new, vectors, stored)
                reader.prefill.skip(writer.stored_kv())
                continue
            new = reader.read(part)
            for chunk, kept in zip(new, sentences):
                chunk.sentences = kept
            writer.add(new, vectors)

