"""Which chunk size retrieves the answer? Retrieval hit rate per chunk size at an equal context budget.

    python benchmarks/chunking.py [--sizes 128,256,512] [--budget 1024] [--limit N] [--out results/chunking.json]

For every answerable SQuAD v2 question (whole Wikipedia articles as documents, from `$CAGKIT_DATA`, default
`../shared/data`), the article is chunked with the source tokenizer exactly as `cagkit ingest` does, the
chunks and question are embedded with the retrieval embedder, and the top `budget / size` chunks are taken.
A hit means one of the gold answers appears in them. No language model runs, so this takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from cagkit.documents import chunk_text
from cagkit.embeddings import embed
from cagkit.evaluation.datasets import load_examples
from cagkit.models import load_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,256,512")
    parser.add_argument("--budget", type=int, default=1024, help="context tokens: top-k = budget / chunk size")
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--data", default="eval/squad_v2/dev-v2.0.part-a.json")
    parser.add_argument("--limit", type=int, default=None, help="the first N questions only (as `cagkit eval`)")
    parser.add_argument("--out", default="results/chunking.json")
    args = parser.parse_args()

    data = Path(os.environ.get("CAGKIT_DATA", "../shared/data")) / args.data
    examples = load_examples(data, limit=args.limit)
    lm = load_model(args.source)
    questions = embed([e.question for e in examples])  # [Q, E]
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        k = max(args.budget // size, 1)
        chunked: dict[str, tuple[list[str], np.ndarray, np.ndarray]] = {}  # texts, embeddings, token counts
        hits, context_tokens = [], []
        for e, q in zip(examples, questions):
            if e.context not in chunked:
                texts = [c.text for c in chunk_text(e.context, lm.count_tokens, size)]
                chunked[e.context] = (texts, embed(texts), np.array([lm.count_tokens(t) for t in texts]))
            texts, vectors, counts = chunked[e.context]
            top = np.argsort(-(vectors @ q), kind="stable")[:k]
            context_tokens.append(int(counts[top].sum()))
            found = " ".join(texts[i] for i in top).lower()
            hits.append(any(a.lower() in found for a in e.answers))
        chunks = sum(len(t) for t, _, _ in chunked.values())
        rows.append({"chunk_tokens": size, "top_k": k, "questions": len(hits), "hit_rate": float(np.mean(hits)),
                     "context_tokens_mean": float(np.mean(context_tokens)), "chunks": chunks})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"data": args.data, "budget": args.budget, "rows": rows,
                               "command": "python benchmarks/chunking.py " + " ".join(sys.argv[1:])}, indent=2))
    print("| chunk tokens | top-k | questions | mean context tokens | answer in retrieved context |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['chunk_tokens']} | {r['top_k']} | {r['questions']} | {r['context_tokens_mean']:.0f} | "
              f"{r['hit_rate']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
