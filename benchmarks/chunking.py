"""Which chunk size and retrieval find the answer? Retrieval hit rate at an equal context budget.

    python benchmarks/chunking.py [--sizes 128,256,512] [--budget 1024] [--retrieval hybrid,dense,lexical]
                                  [--data eval/squad_v2/dev-v2.0.part-a.json] [--limit N] [--out FILE]

For every question of a QA set (from `$CAGKIT_DATA`, default `../shared/data`; any format `cagkit eval` reads:
SQuAD v2 with whole Wikipedia articles, HotpotQA with its ten paragraphs...), the question's documents are
chunked with the source tokenizer exactly as `cagkit ingest` does, the chunks and question are embedded with
the retrieval embedder, and the top `budget / size` chunks of the question's own documents are taken under each
retrieval mode, ranked by `cagkit.retrieval.rank` as `Store.search` ranks them for `cagkit eval` (BM25 word
statistics over the question's own chunks, as in a store holding only them). A hit means one of the gold
answers appears in them. No language model runs, so this takes minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

from cagkit.config import RETRIEVAL_MODES
from cagkit.evaluation.datasets import load_examples
from cagkit.ingest.chunking import chunk_text
from cagkit.models.loading import load_model
from cagkit.retrieval.embeddings import embed
from cagkit.retrieval.lexical import LexicalIndex
from cagkit.retrieval.rank import rank


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="128,256,512")
    parser.add_argument("--budget", type=int, default=1024, help="context tokens: top-k = budget / chunk size")
    parser.add_argument("--retrieval", default="dense", help=f"comma-separated, of {', '.join(RETRIEVAL_MODES)}")
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--data", default="eval/squad_v2/dev-v2.0.part-a.json")
    parser.add_argument("--format", default=None, help="the data format (default: detected)")
    parser.add_argument("--limit", type=int, default=None, help="the first N questions only (as `cagkit eval`)")
    parser.add_argument("--out", default="results/chunking.json")
    args = parser.parse_args()
    modes = args.retrieval.split(",")
    if bad := [m for m in modes if m not in RETRIEVAL_MODES]:
        parser.error(f"--retrieval {bad[0]}: use {', '.join(RETRIEVAL_MODES)}")

    data = Path(os.environ.get("CAGKIT_DATA", "../shared/data")) / args.data
    examples = load_examples(data, args.format, limit=args.limit)
    lm = load_model(args.source)
    questions = embed([e.question for e in examples])  # [Q, E]
    documents = list(dict.fromkeys(d for e in examples for d in e.context_documents()))
    number_of = {d: i for i, d in enumerate(documents)}
    rows = []
    for size in [int(s) for s in args.sizes.split(",")]:
        k = max(args.budget // size, 1)
        texts, owner = [], []  # every chunk of every document, and the document it belongs to
        for number, document in enumerate(documents):
            chunks = [c.text for c in chunk_text(document, lm.count_tokens, size)]
            texts += chunks
            owner += [number] * len(chunks)
        vectors = embed(texts)
        counts, owner = np.array([lm.count_tokens(t) for t in texts]), np.array(owner)
        hits = {m: [] for m in modes}
        context_tokens = {m: [] for m in modes}
        for e, q in zip(examples, questions):
            candidates = np.flatnonzero(np.isin(owner, [number_of[d] for d in e.context_documents()]))
            dense = vectors[candidates] @ q
            words = LexicalIndex([texts[i] for i in candidates]).scores(e.question)
            for mode in modes:
                top = candidates[rank(dense, words, mode, k)[0]]
                context_tokens[mode].append(int(counts[top].sum()))
                found = " ".join(texts[i] for i in top).lower()
                hits[mode].append(any(a.lower() in found for a in e.answers))
        for mode in modes:
            rows.append({"chunk_tokens": size, "top_k": k, "retrieval": mode, "questions": len(hits[mode]),
                         "hit_rate": float(np.mean(hits[mode])),
                         "context_tokens_mean": float(np.mean(context_tokens[mode])), "chunks": len(texts)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"data": args.data, "budget": args.budget, "rows": rows,
                               "command": "python benchmarks/chunking.py " + " ".join(sys.argv[1:])}, indent=2))
    print("| chunk tokens | top-k | retrieval | questions | mean context tokens | answer in retrieved context |")
    print("|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['chunk_tokens']} | {r['top_k']} | {r['retrieval']} | {r['questions']} | "
              f"{r['context_tokens_mean']:.0f} | {r['hit_rate']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
