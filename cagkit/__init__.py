"""cagkit: cache-augmented generation over long documents with KV caches shared across models.

    import cagkit
    cagkit.ingest(["docs/"], store="stores/default")
    answer = cagkit.ask("What does the store keep?", store="stores/default", model="gemma")
    print(answer.answer, answer.sources, answer.timings)
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys
import types as _types
from typing import TYPE_CHECKING

from cagkit.errors import CagkitError

# The public names and the module each comes from. They are imported on first use (PEP 562), so that importing
# cagkit, or running `cagkit --help`, does not load PyTorch and transformers until something needs them.
_LAZY = {"Answer": "cagkit.ask", "ask": "cagkit.ask", "retrieve": "cagkit.retrieval.search",
         "IngestReport": "cagkit.ingest.pipeline", "ingest": "cagkit.ingest.pipeline",
         "ingest_texts": "cagkit.ingest.pipeline", "remove": "cagkit.ingest.pipeline", "load_model": "cagkit.models",
         "Store": "cagkit.store"}

if TYPE_CHECKING:
    from cagkit.ask import Answer, ask
    from cagkit.ingest.pipeline import IngestReport, ingest, ingest_texts, remove
    from cagkit.models import load_model
    from cagkit.retrieval.search import retrieve
    from cagkit.store import Store

__all__ = ["Answer", "CagkitError", "IngestReport", "Store", "ask", "ingest", "ingest_texts", "load_model", "remove",
           "retrieve"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'cagkit' has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    """The public names, the dunders and the submodules imported so far; not this file's own helpers."""
    hidden = {"TYPE_CHECKING", "annotations"}
    names = (set(globals()) | set(__all__)) - hidden
    return sorted(n for n in names if not n.startswith("_") or n.startswith("__"))


class _Package(_types.ModuleType):
    """Keeps `cagkit.ask` and `cagkit.ingest` the functions: importing the module and the package of the same
    names would otherwise bind them there (as `import cagkit.ask` does), and `cagkit.ask(...)` would stop working."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, _types.ModuleType) and value.__name__ == f"{__name__}.{name}" and name in _LAZY:
            return  # the function comes from __getattr__, or is bound already
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package
