"""The server's store as each thread reads it: open once per thread, opened again after the manifest changed."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from cagkit.errors import StoreError
from cagkit.store import lance
from cagkit.store.store import Store, is_store


class StoreMissing(StoreError):
    """The server's store does not exist yet."""


class StoreReader:
    """Hands each thread its own open `Store` of `path`.

    Per thread, because a SQLite connection belongs to the thread that opened it. An open store ranks chunks
    from the index it read on its first search, so after an ingest (this server's or another process's) commits
    to the manifest, the thread's store is opened again and sees the new documents; a document an ingest is
    still writing is not in the manifest yet, so no reader sees it half-written.
    """

    def __init__(self, path: str | Path):
        self.path = path if lance.is_url(path) else Path(path)
        self._local = threading.local()
        self._writes = 0  # this server's commits, counted by `written`

    def written(self) -> None:
        """Note that this server committed to the store, so that every thread opens it again (a file's time
        can miss a commit made within the same clock tick)."""
        self._writes += 1

    def current(self) -> Store:
        """This thread's open store, as of the manifest's last commit."""
        version = self.version()  # before opening: a commit in between makes the next call open it again
        if version is None:
            raise StoreMissing(f"the server's store {self.path} does not exist yet; add documents with "
                               f"POST /v1/ingest or `cagkit ingest DOCS --store {self.path}`")
        held = getattr(self._local, "held", None)
        if held is not None and held[1] == version:
            return held[0]
        if held is not None:
            held[0].close()
        store = Store.open(self.path)
        self._local.held = (store, version)
        return store

    def version(self) -> tuple | None:
        """What changes whenever a commit changes the manifest: this server's commits, SQLite's change counter
        in the file's header, and the size and time of the file and of its write-ahead log (where SQLite commits
        in WAL mode); None when there is no store. A LanceDB store (a URL, or a local one) reads the latest
        version of its manifest at every search and load, so it is opened once per thread."""
        if lance.is_lance_store(self.path):
            return ("lance",) if is_store(self.path) else None
        manifest = self.path / "manifest.sqlite"
        try:
            with open(manifest, "rb") as f:
                header = f.read(28)[24:28]  # the file change counter, bumped by every commit outside WAL mode
                main = os.fstat(f.fileno())
        except FileNotFoundError:
            return None
        try:
            wal = os.stat(f"{manifest}-wal")
            wal_key = (wal.st_mtime_ns, wal.st_size)
        except FileNotFoundError:
            wal_key = None
        return self._writes, header, main.st_mtime_ns, main.st_size, wal_key

    def disk_bytes(self) -> int:
        """The store's size on disk: its manifest and KV files (a LanceDB store: its KV files)."""
        if lance.is_lance_store(self.path):
            try:
                return self.current().summary(checksums=False)["bytes"]
            except StoreError:
                return 0
        total = 0
        for folder in (self.path, self.path / "kv"):
            try:
                total += sum(e.stat().st_size for e in os.scandir(folder) if e.is_file())
            except FileNotFoundError:
                pass
        return total
