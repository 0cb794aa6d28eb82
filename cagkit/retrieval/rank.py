"""Which stored chunks answer a question: dense (embedding), lexical (BM25) and hybrid retrieval.

The embedder finds chunks that say the same thing in other words; BM25 finds the chunks that share the
question's rare words (names, numbers, terms), which small embedders often rank low. `hybrid` fuses the two
rankings by reciprocal rank (each chunk scores 1 / (RRF_K + rank) in each list, summed; `rank` scales the sum
so that first in both lists is 1). How often each finds the gold answer, and what that does to answers, is
measured in docs/retrieval.md.

Numpy only (no PyTorch), so the store can rank without loading a model.
"""

from __future__ import annotations

import numpy as np

from cagkit.config import RETRIEVAL_MODES
from cagkit.errors import CagkitError

# The constant of reciprocal rank fusion (Cormack, Clarke and Buettcher, SIGIR 2009), at the value they
# propose; it is not tuned on our evaluation sets.
RRF_K = 60


def check_retrieval(mode: str) -> None:
    if mode not in RETRIEVAL_MODES:
        raise CagkitError(f"--retrieval must be one of {', '.join(RETRIEVAL_MODES)}, got '{mode}'")


def _ranks(scores: np.ndarray) -> np.ndarray:
    """Each entry's 0-based rank, best (highest) first; ties keep their order."""
    order = np.argsort(-scores, kind="stable")
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[order] = np.arange(len(scores))
    return ranks


def rank(dense: np.ndarray, lexical: np.ndarray | None, mode: str, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The positions of the `top_k` best candidates under `mode`, best first, and their scores: the cosine
    similarity (dense), the BM25 score (lexical) or the fused reciprocal-rank score (hybrid), scaled to 1 for a
    candidate that both rankings put first."""
    check_retrieval(mode)
    if mode == "dense":
        scores = dense
    elif lexical is None:
        raise CagkitError(f"{mode} retrieval needs the question's text, not only its embedding")
    elif mode == "lexical":
        scores = lexical
    else:  # scaled so that 1 means first in both rankings
        scores = (RRF_K + 1) / 2 * (1.0 / (RRF_K + 1 + _ranks(dense)) + 1.0 / (RRF_K + 1 + _ranks(lexical)))
    best = np.argsort(-scores, kind="stable")[:top_k]
    return best, scores[best]
