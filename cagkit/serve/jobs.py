"""Background ingest for `POST /v1/ingest`: one job at a time (a store has one writer), progress per document."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from cagkit.errors import CagkitError
from cagkit.ingest.pipeline import IngestReport, ingest, ingest_texts
from cagkit.serve.store import StoreReader
from cagkit.store.store import Store, StoreBusyError

log = logging.getLogger("cagkit.serve")

BUSY_POLL_S = 0.5  # how often a job whose store another process is writing tries again


@dataclass
class IngestJob:
    """One ingest request: its documents, what became of them so far, and its state (queued, running,
    waiting: another process, a `cagkit ingest`, is writing the store, and the job goes on when it is done;
    succeeded or failed)."""

    id: str
    # what to ingest, in order: (doc_id, text, metadata) for a text, or a file's Path; emptied once done
    todo: list[tuple[str, str, dict | None] | Path]
    documents: int
    status: str = "queued"
    done: int = 0
    report: IngestReport = field(default_factory=IngestReport)
    error: str | None = None
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None

    def to_dict(self) -> dict:
        r = self.report
        return {"id": self.id, "object": "ingest.job", "status": self.status, "documents": self.documents,
                "done": self.done, "added": r.added, "updated": r.updated, "unchanged": r.unchanged,
                "failed": [{"document": path, "reason": reason} for path, reason in r.failed],
                "chunks": r.chunks, "tokens": r.tokens, "error": self.error, "created_at": self.created_at,
                "started_at": self.started_at, "finished_at": self.finished_at}


class IngestJobs:
    """Runs ingest jobs on one background thread, in the order they came.

    Each document is ingested and committed on its own (`cagkit.ingest`), so questions answered meanwhile see
    every finished document and none that is half-written, and the job's `done` counts them. A new store is
    built with the defaults of `cagkit ingest`; an existing one is added to with its own source model and chunk
    size.
    """

    def __init__(self, reader: StoreReader, device: str | None = None):
        self.reader = reader
        self.device = device
        self._jobs: dict[str, IngestJob] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="cagkit-ingest")

    def submit(self, todo: list[tuple[str, str, dict | None] | Path]) -> IngestJob:
        """Queue the documents for ingest; the job's state is at `get(job.id)`."""
        job = IngestJob(id=f"ingest-{uuid.uuid4().hex[:16]}", todo=list(todo), documents=len(todo))
        with self._lock:
            self._jobs[job.id] = job
        self._thread.submit(self._run, job)
        return job

    def get(self, job_id: str) -> IngestJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def close(self) -> None:
        """Drop queued jobs and stop the running one after its current document (committed, so kept)."""
        self._stopping.set()
        self._thread.shutdown(wait=False, cancel_futures=True)

    def _run(self, job: IngestJob) -> None:
        job.status, job.started_at = "running", time.time()
        try:
            settings = self._store_settings()
            for item in job.todo:
                if self._stopping.is_set():
                    job.status, job.error = "failed", f"the server stopped after {job.done} of {job.documents} " \
                                                      f"documents; send the rest again"
                    return
                done = self._ingest(job, item, settings)
                if done is None:
                    return
                self.reader.written()
                _merge(job.report, done)
                job.done += 1
            job.status = "succeeded"
        except CagkitError as exc:
            job.status, job.error = "failed", str(exc)
        except Exception as exc:  # the server keeps serving; the job says what went wrong
            log.exception("ingest job %s failed", job.id)
            job.status, job.error = "failed", f"internal error ({type(exc).__name__}: {exc}); see the server's log"
        finally:
            job.todo = []  # the texts are not needed any more
            job.finished_at = time.time()

    def _ingest(self, job: IngestJob, item, settings: dict) -> IngestReport | None:
        """Ingest one document; while another process writes the store the job is `waiting`, trying again every
        `BUSY_POLL_S` (no document is begun before the store is opened, so nothing is redone). None when the
        server stops meanwhile (the job has failed, saying so)."""
        while True:
            try:
                if isinstance(item, Path):
                    return ingest([item], store=self.reader.path, progress=False, device=self.device, **settings)
                return ingest_texts([item], store=self.reader.path, progress=False, device=self.device, **settings)
            except StoreBusyError:
                job.status = "waiting"
            if self._stopping.wait(BUSY_POLL_S):
                job.status, job.error = "failed", f"the server stopped after {job.done} of {job.documents} " \
                                                  f"documents, waiting for another process to finish writing the " \
                                                  f"store; send the rest again"
                return None
            job.status = "running"

    def _store_settings(self) -> dict:
        """The store's source model, chunk size and KV dtype, to add to it with; none for a new store, which
        gets the defaults of `cagkit ingest`."""
        if self.reader.version() is None:
            return {}
        with Store.open(self.reader.path) as st:
            return {"source": st.settings.source, "chunk_tokens": st.settings.chunk_tokens, "dtype": st.settings.dtype}


def _merge(total: IngestReport, part: IngestReport) -> None:
    for name in ("added", "updated", "unchanged", "removed", "upgraded", "failed"):
        getattr(total, name).extend(getattr(part, name))
    total.chunks += part.chunks
    total.tokens += part.tokens
    total.seconds += part.seconds
