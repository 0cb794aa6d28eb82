"""cagkit: cache-augmented generation over long documents with KV caches shared across models.

    import cagkit
    cagkit.ingest(["docs/"], store="stores/default")
    answer = cagkit.ask("What does the store keep?", store="stores/default", model="gemma")
    print(answer.answer, answer.sources, answer.timings)
"""

from cagkit.ask import Answer, ask, retrieve
from cagkit.errors import CagkitError
from cagkit.ingest import IngestReport, ingest, ingest_texts, remove
from cagkit.models import load_model
from cagkit.store import Store

__all__ = ["Answer", "CagkitError", "IngestReport", "Store", "ask", "ingest", "ingest_texts", "load_model", "remove",
           "retrieve"]
__version__ = "0.1.0"
