"""The persistent store: a manifest of documents and chunks (SQLite, or LanceDB in `cagkit.store.lance`) beside
safetensors files of their KV, each chunk checked against its checksum as it is read. `Store.open` and
`Store.open_for_writing` open either kind."""

from cagkit.store.store import (
    ChunkGoneError,
    DamagedChunkError,
    DamagedManifestError,
    Document,
    DocumentWriter,
    Hit,
    NewChunk,
    SQLiteStore,
    Store,
    StoredChunk,
    StoreSettings,
)

__all__ = ["ChunkGoneError", "DamagedChunkError", "DamagedManifestError", "Document", "DocumentWriter", "Hit", "NewChunk", "SQLiteStore",
           "Store", "StoreSettings", "StoredChunk"]
