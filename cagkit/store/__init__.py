"""The persistent store: a SQLite manifest of documents and chunks beside one safetensors file of KV per chunk."""

from cagkit.store.store import Document, Hit, NewChunk, Store, StoredChunk, StoreSettings

__all__ = ["Document", "Hit", "NewChunk", "Store", "StoreSettings", "StoredChunk"]
