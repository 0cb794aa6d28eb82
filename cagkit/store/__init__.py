"""The persistent store: a manifest of documents and chunks (SQLite in `cagkit.store.store`, or LanceDB in
`cagkit.store.lance`) beside safetensors files of their KV, each chunk checked against its checksum as it is read.
`open_store` (and `Store.open`, `Store.open_for_writing`) open either kind; what both share is in
`cagkit.store.base`. Both kinds are imported here, so that `open_store` knows them (`Store.kinds`)."""

from cagkit.store.base import (
    ChunkGoneError,
    DamagedChunkError,
    DamagedManifestError,
    Document,
    Hit,
    NewChunk,
    Store,
    StoredChunk,
    StoreSettings,
    check_location,
    is_store,
    open_store,
)
from cagkit.store.lance import LanceStore
from cagkit.store.store import DocumentWriter, SQLiteStore

__all__ = ["ChunkGoneError", "DamagedChunkError", "DamagedManifestError", "Document", "DocumentWriter", "Hit",
           "LanceStore", "NewChunk", "SQLiteStore", "Store", "StoreSettings", "StoredChunk", "check_location",
           "is_store", "open_store"]
