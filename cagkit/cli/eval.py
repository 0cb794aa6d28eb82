"""`cagkit eval`, `cagkit report` and `cagkit compare`: measure methods on a QA data set
(`cagkit.evaluation.runner.run_eval`), write tables and plots from the results (`cagkit.evaluation.report`), and
compare runs question by question."""

from __future__ import annotations

import json
from pathlib import Path

from cagkit.cli.options import add_device_options, add_placement_options, add_retrieval_option, add_scope_option
from cagkit.config import (
    KV_DTYPES,
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_PREFILL,
    DEFAULT_EVAL_MAX_NEW_TOKENS,
    DEFAULT_EVAL_METHODS,
    DEFAULT_SOURCE,
    DEFAULT_TOP_K,
    EVAL_METHODS,
    PREFILL_KINDS,
)
from cagkit.evaluation.datasets import FORMATS


def add_parser(sub) -> None:
    p = sub.add_parser("eval", help="measure answer quality and speed of each method on a QA data set")
    p.add_argument("--data", required=True, help="JSONL (cagkit format), SQuAD v2 JSON, HotpotQA, L-Eval or RACE file")
    p.add_argument("--format", default=None, choices=FORMATS, help="data format (default: detected from the file)")
    p.add_argument("--source", default=DEFAULT_SOURCE, help="model that ingests the documents (default: %(default)s)")
    p.add_argument("--target", required=True, help="model that answers")
    p.add_argument("--methods", default=",".join(DEFAULT_EVAL_METHODS),
                   help=f"comma-separated, of {', '.join(EVAL_METHODS)}, each optionally with its own scope, as "
                        "native@chunks, and those that place stored KV with their own repair, as "
                        "stored+deviation (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="chunks to retrieve (default: %(default)s)")
    p.add_argument("--full-context", action="store_true", help="give every method the whole context, no retrieval")
    add_retrieval_option(p)
    add_scope_option(p)
    add_placement_options(p)
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_EVAL_MAX_NEW_TOKENS, help="longest answer in tokens (default: %(default)s)")
    p.add_argument("--store", default=None,
                   help="store to ingest the documents into (default: results/stores/<data>-<source>, shared by "
                        "every run over the same data and source)")
    p.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS,
                   help="most source tokens per chunk of that store (default: %(default)s; another size gets its "
                        "own default store and results file, ending in -c<size>)")
    p.add_argument("--prefill", default=DEFAULT_PREFILL, choices=list(PREFILL_KINDS),
                   help="how that store's documents are prefilled, if new (`cagkit ingest --prefill`; default: "
                        "%(default)s)")
    p.add_argument("--dtype", default="float16", choices=list(KV_DTYPES),
                   help="KV dtype of that store, if new (`cagkit ingest --dtype`; default: %(default)s; another "
                        "gets its own default store and results file, ending in -<dtype>)")
    p.add_argument("--out", default=None, help="results JSON (default: results/<data>-<source>-<target>.json)")
    add_device_options(p)
    p.set_defaults(func=run_eval)

    p = sub.add_parser("report", help="write BENCHMARKS.md tables and plots from eval results")
    p.add_argument("results", nargs="+", help="results files of `cagkit eval`")
    p.add_argument("--out", default="BENCHMARKS.md", help="report to write (default: %(default)s)")
    p.add_argument("--plots", default="docs/plots", help="folder for the charts (default: %(default)s)")
    p.add_argument("--note", default=None, help="a paragraph under the title: how and where the runs were made")
    p.set_defaults(func=run_report)

    p = sub.add_parser("compare", help="paired differences between eval runs: each FILE[:METHOD] against the first")
    p.add_argument("runs", nargs="+", metavar="FILE[:METHOD]",
                   help="results files of `cagkit eval` over the same data, each with the method to compare "
                        "(default: mot); the first is the baseline")
    p.add_argument("--gap-to", metavar="FILE[:METHOD]", default=None,
                   help="a reference run, e.g. results.json:native: each run's share of the gap from the first "
                        "(e.g. select) to it that the run closes, with its paired bootstrap interval")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=run_compare)


def run_eval(args) -> int:
    from cagkit.evaluation import runner

    out = runner.run_eval(data=args.data, source=args.source, target=args.target, methods=args.methods.split(","),
                          limit=args.limit, top_k=args.top_k, full_context=args.full_context, out=args.out,
                          data_format=args.format, max_new_tokens=args.max_new_tokens, store=args.store,
                          chunk_tokens=args.chunk_tokens, recompute_layers=args.recompute_layers, blend=args.blend,
                          blend_select=args.blend_select, device=args.device, retrieval=args.retrieval,
                          scope=args.scope, prefill=args.prefill, dtype=args.dtype)
    print(f"wrote {out}")
    return 0


def run_report(args) -> int:
    from cagkit.evaluation.report import write_report

    write_report([Path(p) for p in args.results], Path(args.out), Path(args.plots), note=args.note)
    print(f"wrote {args.out}")
    return 0


def run_compare(args) -> int:
    from cagkit.evaluation.report import compare

    rows = compare(args.runs, gap_to=args.gap_to)
    if args.json:
        print(json.dumps(rows))
        return 0
    name = max(len(f"{r['file']}:{r['method']}") for r in rows)
    place = max(len(r["placement"]) for r in rows)
    print(f"{'run':<{name}}  {'target':<8} {'placement':<{place}} {'n':>4} {'quality':>7} {'/ first':>7}  "
          f"− first (95% interval)")
    for r in rows:
        d = r["difference"]
        diff = "" if d is None else (f"{d['mean']:+.3f} ({d['low']:+.3f} to {d['high']:+.3f}), {d['questions']} q, "
                                     f"{d['same_answers']} the same answer")
        if d is not None and args.gap_to:
            g = r["gap_closed"]
            diff += ("; gap to the reference: none to close" if g is None else
                     f"; closes {g['share']:.0%} of the gap to the reference ({g['low']:.0%} to {g['high']:.0%})")
        quality = "-" if r["quality"] is None else f"{r['quality']:.3f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        print(f"{r['file'] + ':' + r['method']:<{name}}  {r['target']:<8} {r['placement']:<{place}} "
              f"{r['n'] if r['n'] is not None else '-':>4} {quality:>7} {ratio:>7}  {diff}")
    return 0
