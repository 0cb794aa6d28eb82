"""Which chunk size and retrieval find the answer? Retrieval hit rate at an equal context budget.

    python benchmarks/chunking.py [--sizes 128,256,512] [--budget 1024] [--retrieval hybrid,dense,lexical]
                                  [--data eval/squad_v2/dev-v2.0.part-a.json] [--limit N] [--out FILE]
                                  [--engine numpy|lancedb]

For every question of a QA set (from `$CAGKIT_DATA`, default `../shared/data`; any format `cagkit eval` reads:
SQuAD v2 with whole Wikipedia articles, HotpotQA with its ten paragraphs...), the question's documents are
chunked with the source tokenizer exactly as `cagkit ingest` does, the chunks and question are embedded with
the retrieval embedder, and the top `budget / size` chunks of the question's own documents are taken under each
retrieval mode, ranked by `cagkit.retrieval.rank` as `Store.search` ranks them for `cagkit eval` (BM25 word
statistics over the question's own chunks, as in a store holding only them). A hit means one of the gold
answers appears in them. No language model runs, so this takes minutes.

`--engine lancedb` ranks with what a LanceDB store (`cagkit.store.lance`) searches with instead: every chunk in
one LanceDB table with its full-text index, each question's chunks picked by a filter, LanceDB's vector search and
BM25 (its tokenizer: stemmed, English stop words out; its word statistics over every chunk of the table), fused
by `cagkit.store.lance.rrf_scores` over the first `CANDIDATES` of each.
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
from cagkit.bench import write_results
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
    parser.add_argument("--engine", default="numpy", choices=["numpy", "lancedb"],
                        help="rank as the SQLite store does (numpy) or as a LanceDB store does (lancedb)")
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
        table = _lancedb_table(texts, vectors, owner) if args.engine == "lancedb" else None
        for e, q in zip(examples, questions):
            candidates = np.flatnonzero(np.isin(owner, [number_of[d] for d in e.context_documents()]))
            if table is None:
                dense = vectors[candidates] @ q
                words = LexicalIndex([texts[i] for i in candidates]).scores(e.question)
            for mode in modes:
                if table is not None:
                    top = _lancedb_top(table, q, e.question, [number_of[d] for d in e.context_documents()], mode, k)
                else:
                    top = candidates[rank(dense, words, mode, k)[0]]
                context_tokens[mode].append(int(counts[top].sum()))
                found = " ".join(texts[i] for i in top).lower()
                hits[mode].append(any(a.lower() in found for a in e.answers))
        for mode in modes:
            rows.append({"engine": args.engine, "chunk_tokens": size, "top_k": k, "retrieval": mode,
                         "questions": len(hits[mode]),
                         "hit_rate": float(np.mean(hits[mode])),
                         "context_tokens_mean": float(np.mean(context_tokens[mode])), "chunks": len(texts)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    write_results(args.out, {"data": args.data, "budget": args.budget, "rows": rows})
    print("| chunk tokens | top-k | retrieval | questions | mean context tokens | answer in retrieved context |")
    print("|---:|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['chunk_tokens']} | {r['top_k']} | {r['retrieval']} | {r['questions']} | "
              f"{r['context_tokens_mean']:.0f} | {r['hit_rate']:.3f} |")
    return 0


def _lancedb_table(texts: list[str], vectors: np.ndarray, owner: np.ndarray):
    """Every chunk in a LanceDB table in a temporary folder, with the full-text index a LanceDB store builds."""
    import tempfile

    import lancedb
    import pyarrow as pa

    db = lancedb.connect(tempfile.mkdtemp(prefix="chunking-lancedb-"))
    data = pa.table({"id": np.arange(len(texts)), "doc": owner.astype(np.int64), "text": texts,
                     "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.astype(np.float32).ravel()),
                                                                 vectors.shape[1])})
    table = db.create_table("chunks", data=data)
    table.create_fts_index("text", use_tantivy=False)
    table.create_scalar_index("doc")
    return table


def _lancedb_top(table, query: np.ndarray, question: str, docs: list[int], mode: str, k: int) -> np.ndarray:
    from lancedb.query import MatchQuery

    from cagkit.store.lance import CANDIDATES, rrf_scores

    want = max(CANDIDATES, 10 * k)
    where = f"doc IN ({', '.join(map(str, docs))})"
    lists = []
    if mode != "lexical":
        found = table.search(query.astype(np.float32)).distance_type("dot").where(where, prefilter=True) \
            .select(["id", "_distance"]).limit(want).to_arrow()
        lists.append(found.column("id").to_pylist())
    if mode != "dense":
        found = table.search(MatchQuery(question, "text"), query_type="fts").where(where, prefilter=True) \
            .select(["id", "_score"]).limit(want).to_arrow()
        lists.append(found.column("id").to_pylist())
    if mode != "hybrid":
        return np.array(lists[0][:k], dtype=np.int64)
    fused = rrf_scores(lists, want)
    return np.array(sorted(fused, key=lambda i: -fused[i])[:k], dtype=np.int64)


if __name__ == "__main__":
    sys.exit(main())
