"""Retrieve the chunks of a store best for a question.
"""

from __future__ import annotations

from cagkit.config import DEFAULT_RETRIEVAL
from cagkit.errors import CagkitError
from cagkit.retrieval.embeddings import embed_query
from cagkit.store.store import Hit, Store


def retrieve(store: Store, question: str, top_k: int, retrieval: str = DEFAULT_RETRIEVAL,
             documents: list[str] | None = None, vector=None) -> list[Hit]:
    """The `top_k` chunks of `store` (of its `documents` only, when given) best for `question`, best first,
    ranked by `retrieval`: `hybrid` (embedding and BM25 rankings fused), `dense` or `lexical`. `vector`: the
    question's embedding (`embed_query`), where the caller has it already."""
    if top_k < 1:
        raise CagkitError(f"--top-k must be at least 1, got {top_k}")
    if vector is None:
        vector = embed_query(question)
    return store.search(vector, top_k, text=question, retrieval=retrieval, documents=documents)
