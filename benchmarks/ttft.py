"""Time to first token as the context grows: the target prefilling the text (native) against cagkit's stored
cache (reused by the source model, translated for the others).

    python benchmarks/ttft.py [--sizes 512,1024,2048,4096,8192] [--targets smollm2,gemma,qwen] [--out results/ttft.json]

The context is the first N source tokens of a Gutenberg book from the shared data (`$CAGKIT_DATA`, default
`../shared/data`), ingested once with the source model. Each measurement is the median of `--repeats` warm runs
of `answer_from_chunks` with one new token, so it times retrieval-free TTFT: load + translate + prefill.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from cagkit.ask import answer_from_chunks
from cagkit.errors import CagkitError
from cagkit.ingest import ingest
from cagkit.models import load_model
from cagkit.store import Hit, Store

QUESTION = "Who is the main character of this story?"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="512,1024,2048,4096,8192")
    parser.add_argument("--targets", default="smollm2,gemma,qwen")
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--book", default="corpus/gutenberg/testing/chesterton-brown.txt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/ttft.json")
    args = parser.parse_args()

    data = Path(os.environ.get("CAGKIT_DATA", "../shared/data"))
    store_dir = Path("results/stores/ttft") / args.source
    # Only the opening of the book is needed: about 5 characters per token covers the largest size.
    excerpt = Path("results/ttft-context") / Path(args.book).name
    excerpt.parent.mkdir(parents=True, exist_ok=True)
    excerpt.write_text((data / args.book).read_text(encoding="utf-8")[: 5 * max(_sizes(args))])
    ingest([excerpt], store=store_dir, source=args.source, progress=False)
    rows = []
    with Store.open(store_dir) as store:
        chunks = [store.load_chunk(i) for i in store.chunk_ids(str(excerpt.resolve()))]
        for target in args.targets.split(","):
            lm = load_model(target)
            for size in _sizes(args):
                hits, total = [], 0
                for c in chunks:
                    if total >= size:
                        break
                    hits.append(Hit(c.chunk_id, c.doc_path, c.idx, c.text, 1.0))
                    total += len(c.token_ids)
                for mode in ("native", "mot"):
                    rows.append(_measure(lm, store, hits, mode, size, args.repeats))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"source": args.source, "book": args.book, "threads": torch.get_num_threads(), "question": QUESTION,
            "command": "python benchmarks/ttft.py " + " ".join(sys.argv[1:])}
    out.write_text(json.dumps({"settings": meta, "rows": rows}, indent=2))
    _print_table(rows)
    return 0


def _sizes(args) -> list[int]:
    return [int(s) for s in args.sizes.split(",")]


def _measure(lm, store, hits, mode, size, repeats) -> dict:
    runs = []
    used = mode
    for _ in range(repeats + 1):  # the first run warms up and is dropped
        try:
            answer = answer_from_chunks(lm, store, hits, QUESTION, mode, max_new_tokens=1)
        except CagkitError as exc:
            return {"target": lm.name, "mode": mode, "context_tokens": size, "error": str(exc)}
        runs.append(answer.timings)
        used = answer.mode
    runs = runs[1:]
    return {
        "target": lm.name,
        "mode": used,
        "context_tokens": answer.context_tokens,
        "ttft_ms": statistics.median(r["ttft_ms"] for r in runs),
        "translate_ms": statistics.median(r["translate_ms"] for r in runs),
        "prefill_ms": statistics.median(r["prefill_ms"] for r in runs),
        "load_ms": statistics.median(r["load_ms"] for r in runs),
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
    }


def _print_table(rows) -> None:
    print("| target | mode | context tokens | TTFT ms | load ms | translate ms | prefill ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['target']} | {r['mode']} | {r['context_tokens']} | error: {r['error'][:60]} | | | |")
        else:
            print(f"| {r['target']} | {r['mode']} | {r['context_tokens']} | {r['ttft_ms']:.0f} | {r['load_ms']:.0f} | "
                  f"{r['translate_ms']:.0f} | {r['prefill_ms']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
