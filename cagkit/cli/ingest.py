"""`cagkit ingest`: prefill documents with the source model and store their KV (`cagkit.ingest.pipeline.ingest`)."""

from __future__ import annotations

import sys

from cagkit.cli.options import add_device_options, add_store_option
from cagkit.config import DEFAULT_CHUNK_TOKENS, DEFAULT_SOURCE, KV_DTYPES


def add_parser(sub) -> None:
    p = sub.add_parser("ingest", help="prefill documents with the source model and store their KV cache",
                       epilog="exit status: 0 when every document is stored or unchanged; 1 when some could not be "
                              "read (each is named on stderr, the others are stored); 2 on an error that stopped "
                              "the run (what was finished is kept)")
    p.add_argument("paths", nargs="+", help="files or folders (.txt .md .rst .html .pdf)")
    add_store_option(p)
    p.add_argument("--source", default=DEFAULT_SOURCE, help="source model: alias, Hugging Face id or directory (default: %(default)s)")
    p.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS, help="most source tokens per chunk (default: %(default)s)")
    p.add_argument("--prune", action="store_true", help="drop stored documents whose files no longer exist")
    p.add_argument("--dtype", default="float16", choices=list(KV_DTYPES), help="stored KV dtype (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--wait", action="store_true", help="when another cagkit process is writing the store, wait for it "
                                                       "to finish instead of stopping")
    add_device_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from cagkit.ingest.pipeline import ingest

    report = ingest(args.paths, store=args.store, source=args.source, chunk_tokens=args.chunk_tokens,
                    prune=args.prune, dtype=args.dtype, progress=not args.quiet, device=args.device,
                    wait=args.wait)
    print(
        f"{len(report.added)} added, {len(report.updated)} updated, {len(report.unchanged)} unchanged, "
        f"{len(report.removed)} removed, {len(report.failed)} skipped; {report.chunks} chunks, {report.tokens} tokens "
        f"in {report.seconds:.1f} s ({report.tokens_per_s:.0f} tokens/s) -> {args.store}"
    )
    if report.orphans:
        print(f"removed {len(report.orphans)} KV files an interrupted run of cagkit had left in {args.store}/kv")
    if report.upgraded:
        print(f"{len(report.upgraded)} unchanged documents were given the sentence embeddings this cagkit keeps")
    for path, reason in report.failed:
        print(f"skipped {path}: {reason}", file=sys.stderr)
    return 1 if report.failed else 0  # the rest is stored; a script still learns that something was left out
