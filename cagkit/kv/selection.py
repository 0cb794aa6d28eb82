"""Which context tokens the question selects: whole sentences, the ones most similar to the question first.

The repair (`cagkit.kv.repair.blend`) recomputes a share R of the context's tokens in this order, and the `select`
control (`cagkit.kv.context.SelectedSentences`) gives the target only the sentences holding those same tokens, so
the two read the same sentences under the same budget. A chunk's sentences are their character spans with unit
MiniLM embeddings (`cagkit.retrieval.embeddings.embed_sentences`), as the store keeps them or computed here.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from cagkit.retrieval.embeddings import embed_query, embed_sentences


def budget(ratio: float, total: int) -> int:
    """How many of `total` context tokens a share `ratio` selects: the nearest whole number, at least one (so at
    most ceil(ratio * total) for any ratio above 0), and none of an empty context."""
    return min(total, max(1, round(ratio * total)))


def top_tokens(order: torch.Tensor, ratio: float) -> torch.Tensor:
    """The indices of the `budget(ratio, T)` highest entries of `order` [T], in increasing (document) order; none
    for an empty context (T = 0)."""
    return torch.topk(order, budget(ratio, len(order))).indices.sort().values


def token_sentences(spans, token_spans) -> torch.Tensor:
    """[T] the index of the sentence (of char `spans` [S, 2]) holding each token's last character (of char
    `token_spans` [T, 2]), so " The" opens its sentence; -1 for a token in no sentence (whitespace between them)."""
    last_chars = torch.as_tensor(token_spans, dtype=torch.long).reshape(-1, 2)[:, 1] - 1
    out = torch.full((len(last_chars),), -1, dtype=torch.long)
    for index, (lo, hi) in enumerate(torch.as_tensor(spans).reshape(-1, 2).tolist()):
        out[(last_chars >= lo) & (last_chars < hi)] = index
    return out


def question_priority(question_vector, sentences: list[tuple], offsets: list[torch.Tensor]) -> torch.Tensor:
    """Per context token, how relevant its sentence is to the question: the selection order for `blend` that
    recomputes whole sentences, most similar first, instead of the tokens the layer-1 deviation picks.

    question_vector: the question's unit embedding [E]; sentences: per chunk, its sentence character spans
    [S, 2] and unit embeddings [S, E] (`chunk_sentences`); offsets: per chunk, the [T, 2] character spans of its
    KV positions' tokens (`token_sentences` says which sentence a token belongs to). Tokens in no sentence come
    last; within a sentence earlier tokens come first, so a sentence cut by the budget keeps its start.
    """
    query = torch.tensor(question_vector, dtype=torch.float64)  # a copy: the vector may be read-only
    out = []
    for (spans, vectors), token_spans in zip(sentences, offsets, strict=True):
        scores = torch.as_tensor(vectors, dtype=torch.float64) @ query  # [S]
        # index -1 (no sentence) reads the appended -2, below any cosine similarity
        priority = torch.cat([scores, torch.tensor([-2.0], dtype=torch.float64)])[token_sentences(spans, token_spans)]
        # the step is far below any score difference that matters
        out.append(priority - 1e-6 * torch.arange(len(priority), dtype=torch.float64) / max(len(priority), 1))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


def question_order(question: str, texts: list[str], offsets: list[torch.Tensor],
                   stored: list[tuple | None] | None = None, vector=None) -> torch.Tensor:
    """`question_priority` [total tokens] of the chunks `texts` for `question`; `offsets` as there, `stored` as for
    `chunk_sentences`; `vector`: the question's embedding where the caller has it (retrieval made it), else
    embedded here."""
    return question_priority(_vector(question, vector), chunk_sentences(texts, stored), offsets)


def _vector(question: str, vector):
    return embed_query(question) if vector is None else vector


def selected_sentences(tokenizer, texts: list[str], question: str, ratio: float,
                       vector=None) -> list[list[tuple[int, int]]]:
    """Per chunk of `texts`, the char spans of the sentences `select` gives the target, in document order
    (`vector`: the question's embedding, as for `question_order`).

    The rule: the chunks are tokenised alone by the target's `tokenizer` (T tokens in all, as the repair counts
    them), the `budget(ratio, T)` tokens first in `question_order` are chosen, and every sentence holding a chosen
    token is kept whole. So the kept sentences are the most similar to the question, and they hold at most the
    budget plus the rest of the one sentence the budget cuts (the least similar kept; sentences of equal scores
    in two chunks could both be cut).
    """
    offsets = [torch.tensor(tokenizer(t, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"],
                            dtype=torch.long).reshape(-1, 2) for t in texts]  # [T, 2] per chunk
    sentences = chunk_sentences(texts)
    chosen = torch.zeros(sum(len(o) for o in offsets), dtype=torch.bool)
    chosen[top_tokens(question_priority(_vector(question, vector), sentences, offsets), ratio)] = True
    out = []
    for (spans, _), token_spans, picked in zip(sentences, offsets, chosen.split([len(o) for o in offsets])):
        held = token_sentences(spans, token_spans)[picked]
        out.append([(int(spans[i][0]), int(spans[i][1])) for i in sorted(set(held[held >= 0].tolist()))])
    return out


_COMPUTED_SENTENCES: OrderedDict[str, tuple] = OrderedDict()  # chunk text -> (spans, embeddings), newest last
_COMPUTED_SENTENCES_MAX = 4096


def chunk_sentences(texts: list[str], stored: list[tuple | None] | None = None) -> list[tuple]:
    """Each chunk's sentence spans [S, 2] and unit embeddings [S, E]: `stored[i]` where the store kept them, else
    computed now (stores ingested before cagkit kept them, and `select`, which reads nothing of the store) and
    remembered for the next question in this process, which often retrieves the same chunks: embedding their
    sentences costs about as much as the repair itself."""
    stored = stored if stored is not None else [None] * len(texts)
    missing = list(dict.fromkeys(t for t, s in zip(texts, stored, strict=True)
                                 if s is None and t not in _COMPUTED_SENTENCES))
    for text, found in zip(missing, embed_sentences(missing) if missing else []):
        _COMPUTED_SENTENCES[text] = found
    out = []
    for text, kept in zip(texts, stored):
        if kept is not None:
            out.append(kept)
        else:
            _COMPUTED_SENTENCES.move_to_end(text)
            out.append(_COMPUTED_SENTENCES[text])
    while len(_COMPUTED_SENTENCES) > _COMPUTED_SENTENCES_MAX:
        _COMPUTED_SENTENCES.popitem(last=False)
    return out
