"""What the benchmarks that answer a data set's questions from a store share: their arguments, and each question's
retrieved hits and the documents placed for it at document scope."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import torch

from cagkit.ask import choose_scope
from cagkit.evaluation.datasets import load_examples
from cagkit.evaluation.runner import documents_dir, example_hits, write_documents
from cagkit.generation import context_room, prompt_parts


def question_arguments(description: str, store_help: str, limit: int = 30) -> argparse.ArgumentParser:
    """A parser with the store, the model that wrote it, the questions (`--data`, `--format`, `--limit`),
    `--threads` and `--out`."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", required=True, help=store_help)
    ap.add_argument("--model", required=True, help="the model that wrote the store, which answers")
    ap.add_argument("--data", required=True)
    ap.add_argument("--format", required=True)
    ap.add_argument("--limit", type=int, default=limit)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    return ap


def document_questions(lm, store, args, top_k: int = 4, max_new_tokens: int = 24) -> Iterator[tuple]:
    """(example, its top-`top_k` hits, the chunks placed for them at document scope, the scope used) for each of
    `args.limit` questions of `args.data`, their documents written beside the store as `cagkit eval` writes them."""
    examples = load_examples(args.data, args.format, args.limit)
    paths = write_documents(examples, documents_dir(store.path))
    room = context_room(lm, *prompt_parts(lm, "?"), max_new_tokens)
    for example, doc_paths in zip(examples, paths):
        hits = example_hits(store, example.question, doc_paths, top_k, False)
        placed, scope, _ = choose_scope(store, hits, "document", room, "stored")
        yield example, hits, placed, scope


def first_token(lm, cache, ids: list[int]) -> torch.Tensor:
    """Log-probabilities [V] of the token after `ids` prefilled into `cache` (which the prefill extends)."""
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1).logits
    return torch.log_softmax(logits[0, -1].float(), -1)


def agreement(reference: torch.Tensor, other: torch.Tensor) -> tuple[int, float]:
    """Whether two `first_token` distributions take the same token (1 or 0), and KL(reference || other)."""
    same = int(other.argmax() == reference.argmax())
    return same, float((reference.exp() * (reference - other)).sum())
