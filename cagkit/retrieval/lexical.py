"""BM25 over chunk texts: finds the chunks that share a question's rare words (names, numbers, terms),
which small embedders often rank low.
"""

from __future__ import annotations

import math
import re

import numpy as np

BM25_K1, BM25_B = 1.2, 0.75



_WORD = re.compile(r"\w+")
# Words too common to tell chunks apart; without them a question's "what was the" weighs on every chunk.
_STOPWORDS = frozenset(
    "a an and are as at be been but by can did do does for from had has have how i if in into is it its of on or "
    "so than that the their them then there these they this those to was were what when where which who whom "
    "whose why will with would".split()
)


def terms(text: str) -> list[str]:
    """The words BM25 matches on: lower-cased word characters (any script), stopwords left out."""
    return [w for w in _WORD.findall(text.casefold()) if w not in _STOPWORDS]


class LexicalIndex:
    """BM25 (Okapi, k1 = 1.2, b = 0.75) over a fixed list of texts, with an inverted index per word.

    Built with one pass of Python over the words and the rest in numpy: 10,000 chunks of 180 words took 2.9 s
    here with other jobs on both cores (a store builds it once per process, on its first lexical search)."""

    def __init__(self, texts: list[str]):
        self.size = len(texts)
        vocabulary: dict[str, int] = {}
        words, owners = [], []
        for i, text in enumerate(texts):
            found = [vocabulary.setdefault(w, len(vocabulary)) for w in terms(text)]
            words += found
            owners += [i] * len(found)
        n = max(self.size, 1)  # one (word, text) pair is word * n + text
        pairs, tf = np.unique(np.array(words, dtype=np.int64) * n + np.array(owners, dtype=np.int64),
                              return_counts=True)  # sorted by word, then text
        self.docs, self.tf = pairs % n, tf.astype(np.float64)
        bounds = np.searchsorted(pairs // n, np.arange(len(vocabulary) + 1))
        self.postings = {w: (bounds[i], bounds[i + 1]) for w, i in vocabulary.items()}  # word -> its slice
        self.lengths = np.bincount(np.array(owners, dtype=np.int64), minlength=self.size).astype(np.float64)
        mean = self.lengths.mean() if self.size else 1.0
        self.norm = BM25_K1 * (1 - BM25_B + BM25_B * self.lengths / max(mean, 1e-9))  # [N]

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every text for `query` [N]; 0 for a text that shares none of its words."""
        out = np.zeros(self.size)
        for word in set(terms(query)):
            if word not in self.postings:
                continue
            a, b = self.postings[word]
            docs, tf = self.docs[a:b], self.tf[a:b]
            idf = math.log(1 + (self.size - (b - a) + 0.5) / ((b - a) + 0.5))
            out[docs] += idf * tf * (BM25_K1 + 1) / (tf + self.norm[docs])
        return out
