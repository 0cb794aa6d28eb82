"""`cagkit ingest`: prefill documents with the source model and store their KV (`cagkit.ingest.pipeline.ingest`)."""

from __future__ import annotations

import sys

from cagkit.cli.options import add_device_options, add_store_option
from cagkit.config import DEFAULT_CHUNK_TOKENS, DEFAULT_PREFILL, DEFAULT_SOURCE, KV_DTYPES, PREFILL_KINDS
from cagkit.store.store import MANIFESTS


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
    p.add_argument("--dtype", default="float16", choices=list(KV_DTYPES), help="stored KV dtype: float16, bfloat16, float32, or compressed, int8 (0.53x float16's "
                   "bytes) or int4 (about 0.29x), keys per channel and values per token (default: %(default)s)")
    p.add_argument("--prefill", default=DEFAULT_PREFILL, choices=list(PREFILL_KINDS),
                   help="how the source reads a document: whole, causally from its start, each chunk's KV its slice "
                        "of the document's cache (document), or each chunk alone (chunks) (default: %(default)s)")
    p.add_argument("--window", type=int, default=None, metavar="N",
                   help="with --prefill document: the most tokens a token attends over; past it the cache slides, "
                        "keeping the document's first tokens (default and cap: the source's context length)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--wait", action="store_true", help="when another cagkit process is writing the store, wait for it "
                                                       "to finish instead of stopping")
    p.add_argument("--manifest", default="sqlite", choices=list(MANIFESTS),
                   help="for a new local store: keep its manifest in SQLite (one machine) or LanceDB (several "
                        "writers, search indexes; what a store at a URL always uses) (default: %(default)s)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="ingest on Ray into a LanceDB store: the cluster at ADDRESS (ray://host:10001, or auto), "
                        "or without ADDRESS a local Ray started for the run (needs the scale extra)")
    p.add_argument("--actors", type=int, default=2, help="with --ray: source models prefilling at once, one per "
                                                         "actor, each with a GPU where the cluster has them "
                                                         "(default: %(default)s)")
    add_device_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.ray is not None:
        from cagkit.ingest.distributed import ingest_ray

        report = ingest_ray(args.paths, args.store, address=None if args.ray == "local" else args.ray,
                            actors=args.actors, source=args.source, chunk_tokens=args.chunk_tokens,
                            dtype=args.dtype, prune=args.prune, device=args.device, progress=not args.quiet,
                            prefill=args.prefill, window=args.window)
    else:
        from cagkit.ingest.pipeline import ingest

        report = ingest(args.paths, store=args.store, source=args.source, chunk_tokens=args.chunk_tokens,
                        prune=args.prune, dtype=args.dtype, progress=not args.quiet, device=args.device,
                        wait=args.wait, manifest=args.manifest, prefill=args.prefill, window=args.window)
    print(
        f"{len(report.added)} added, {len(report.updated)} updated, {len(report.unchanged)} unchanged, "
        f"{len(report.removed)} removed, {len(report.failed)} skipped; {report.chunks} chunks, {report.tokens} tokens "
        f"in {report.seconds:.1f} s ({report.tokens_per_s:.0f} tokens/s) -> {args.store}"
    )
    if report.orphans:
        print(f"removed {len(report.orphans)} files an interrupted run of cagkit had left in {args.store}")
    if report.upgraded:
        print(f"{len(report.upgraded)} unchanged documents were given the sentence embeddings this cagkit keeps")
    for path, reason in report.failed:
        print(f"skipped {path}: {reason}", file=sys.stderr)
    return 1 if report.failed else 0  # the rest is stored; a script still learns that something was left out
