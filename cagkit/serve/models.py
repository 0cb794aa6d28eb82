"""The served models: each loaded once and kept, at most `max_loaded` at a time, each with a thread of its own."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from cagkit.models.loading import LoadedModel, load_model, unload_model

T = TypeVar("T")


class ModelPool:
    """Runs work on the served models.

    Each model has one thread, so the requests for a model run one at a time in arrival order (on a CPU two
    forwards of one model only share its cores) while different models run side by side. A model loads on its
    thread when first needed and stays loaded; when `max_loaded` are loaded already, the least recently used one
    that no request is using is unloaded first, or, when all are in use, the load waits for one to finish.
    """

    def __init__(self, names: tuple[str, ...], max_loaded: int, device: str | None = None,
                 on_unload: Callable[[LoadedModel], object] | None = None):
        """`on_unload(model)` runs after a model is unloaded to make room for another (the server drops its warm
        contexts, which hold that model's cache)."""
        self.names = names
        self.on_unload = on_unload
        self.max_loaded = max_loaded
        self.device = device
        self._threads = {name: ThreadPoolExecutor(1, thread_name_prefix=f"cagkit-model-{i}")
                         for i, name in enumerate(names)}
        self._loaded: OrderedDict[str, LoadedModel | None] = OrderedDict()  # least recently used first; None: loading
        self._busy: set[str] = set()
        self._changed = threading.Condition()

    def submit(self, name: str, work: Callable[[LoadedModel], T]) -> Future[T]:
        """Queue `work(model)` on `name`'s thread. Cancelling the future before it starts takes it off the queue."""
        return self._threads[name].submit(self._run, name, work)

    def loaded(self) -> list[str]:
        """The models in memory now, least recently used first."""
        with self._changed:
            return [name for name, lm in self._loaded.items() if lm is not None]

    def preload(self) -> None:
        """Load the first `max_loaded` models now, so that their first requests do not wait for them."""
        for name in self.names[: self.max_loaded]:
            self.submit(name, lambda lm: None).result()

    def close(self) -> None:
        """Drop queued work and stop the threads once their current work ends."""
        for thread in self._threads.values():
            thread.shutdown(wait=False, cancel_futures=True)

    def _run(self, name: str, work: Callable[[LoadedModel], T]) -> T:
        lm = self._acquire(name)
        try:
            return work(lm)
        finally:
            with self._changed:
                self._busy.discard(name)
                self._changed.notify_all()

    def _acquire(self, name: str) -> LoadedModel:
        """`name`'s model, loaded if it is not, marked busy so that it is not unloaded under its request."""
        with self._changed:
            self._busy.add(name)
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return self._loaded[name]
            while len(self._loaded) >= self.max_loaded:
                idle = next((n for n, lm in self._loaded.items() if n not in self._busy and lm is not None), None)
                if idle is None:
                    self._changed.wait()
                    continue
                gone = self._loaded.pop(idle)
                unload_model(idle, self.device)
                if self.on_unload is not None:
                    self.on_unload(gone)
            self._loaded[name] = None  # holds the place while it loads, outside the lock (seconds)
        try:
            lm = load_model(name, self.device)
        except BaseException:
            with self._changed:
                del self._loaded[name]
                self._busy.discard(name)
                self._changed.notify_all()
            raise
        with self._changed:
            self._loaded[name] = lm
        return lm
