"""Warm document caches: recently placed contexts kept in memory, so a second question on the same documents pays
only its own prefill.

What is kept is the target's cache up to the question: the prompt prefix, then the placed (and, for another
model's store, translated) KV of the chosen chunks, exactly as `cagkit.ask.build_context_cache` built it. It does
not depend on the question as long as the placement recomputes nothing chosen by the question, so only contexts
placed with `blend` 0 are kept (the default at document scope; translation and `recompute_layers` depend on the
chunks alone). The key names the model, the store, the stored chunks by id (a replaced document's chunks get new
ids, so a stale entry is never found, only aged out), the mode and the placement. Each question gets its own
cache object sharing the kept tensors (`share_cache`): a question's prefill and decoding extend a `DynamicCache` by
concatenating into new tensors and rebinding its layers' attributes, never writing into the tensors it holds, so
the kept context stays as placed without a copy of its bytes per question (a test extends one and compares).
Entries are evicted least recently used first once their tensors pass `max_bytes`; a context larger than that is
not kept.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import DynamicCache


@dataclass
class WarmContext:
    cache: DynamicCache
    context_tokens: int
    mode: str
    placement: dict
    skipped: list[dict]
    nbytes: int


class WarmCaches:
    """An LRU of placed contexts, bounded in bytes (`max_bytes`; 0 keeps nothing). Safe to share across threads."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise ValueError(f"the warm cache size must be 0 or more bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, WarmContext] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple) -> tuple[WarmContext, DynamicCache] | None:
        """The entry under `key` and a copy of its cache for one question to extend, or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
        return entry, share_cache(entry.cache)

    def drop_model(self, name: str) -> int:
        """Forget every context kept for the model `name` (the first part of each key), as when it is unloaded;
        returns how many were dropped."""
        with self._lock:
            gone = [key for key in self._entries if key[0] == name]
            for key in gone:
                del self._entries[key]
        return len(gone)

    def put(self, key: tuple, entry: WarmContext) -> DynamicCache:
        """Keep `entry` (unless it alone is over the bound), evicting the least recently used past `max_bytes`;
        returns a cache for the caller's question, sharing the entry's tensors when it was kept."""
        if not self.max_bytes or entry.nbytes > self.max_bytes:
            return entry.cache
        question_cache = share_cache(entry.cache)
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            total = sum(e.nbytes for e in self._entries.values())
            while total > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                total -= dropped.nbytes
        return question_cache


def share_cache(cache: DynamicCache) -> DynamicCache:
    """A cache for one question: a new `DynamicCache` and new layer objects over the same tensors (a prefill into
    it rebinds its own layers' tensors and leaves `cache`'s as they are)."""
    shared = copy.copy(cache)
    shared.layers = [copy.copy(layer) for layer in cache.layers]
    return shared


def cache_bytes(cache: DynamicCache) -> int:
    """The bytes of a cache's tensors."""
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
               if t is not None)
