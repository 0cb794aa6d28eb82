"""The persistent store: a SQLite manifest of documents and chunks beside safetensors files of their KV, each chunk
checked against its checksum as it is read."""

from cagkit.store.store import (
    DamagedChunkError,
    DamagedManifestError,
    Document,
    DocumentWriter,
    Hit,
    NewChunk,
    Store,
    StoredChunk,
    StoreSettings,
)

__all__ = ["DamagedChunkError", "DamagedManifestError", "Document", "DocumentWriter", "Hit", "NewChunk", "Store",
           "StoreSettings", "StoredChunk"]
