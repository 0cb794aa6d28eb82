"""`cagkit store info` and `cagkit store remove`: what a store holds (`Store.summary`), or drop documents from it
(`cagkit.ingest.pipeline.remove`)."""

from __future__ import annotations

import json

from cagkit.cli.options import add_store_option


def add_parser(sub) -> None:
    p = sub.add_parser("store", help="what a store holds, or drop documents from it")
    ssub = p.add_subparsers(dest="store_command", required=True)
    t = ssub.add_parser("info", help="the store's settings and, per document, chunks, tokens, KV size and state")
    add_store_option(t)
    t.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    t.set_defaults(func=run_info)
    t = ssub.add_parser("remove", help="drop documents (by file, or every one under a folder) without re-ingesting")
    t.add_argument("paths", nargs="+", help="stored documents: their files or folders, or ids given to ingest_texts")
    add_store_option(t)
    t.set_defaults(func=run_remove)


def run_info(args) -> int:
    from cagkit.store.store import Store

    with Store.open(args.store) as st:
        info = st.summary()
    if args.json:
        print(json.dumps(info))
        return 0
    s = info["settings"]
    print(f"{info['store']}: {info['documents']} documents, {info['chunks']} chunks, {info['tokens']} tokens, "
          f"{info['bytes'] / 1e6:.1f} MB")
    print(f"source {s['source']} (fingerprint {s['source_fingerprint']}), {s['dtype']} KV, chunks of at most "
          f"{s['chunk_tokens']} tokens, embedder {s['embedder']}, format {s['format_version']}")
    if info["per_document"]:
        print(f"\n{'chunks':>6} {'tokens':>7} {'KV MB':>7}  {'state':<12}  document")
    for d in info["per_document"]:
        print(f"{d['chunks']:>6} {d['tokens']:>7} {d['kv_bytes'] / 1e6:>7.1f}  {d['state']:<12}  {d['path']}")
    stale = sum(d["state"] != "ok" for d in info["per_document"])
    if stale:
        print(f"\n{stale} of {info['documents']} documents need `cagkit ingest` again (damaged ones are rebuilt, "
              f"older ones get the sentence embeddings the default repair selects by)")
    return 0


def run_remove(args) -> int:
    from cagkit.ingest.pipeline import remove

    removed = remove(args.paths, store=args.store)
    for path in removed:
        print(f"removed {path}")
    print(f"{len(removed)} document{'s' * (len(removed) != 1)} removed from {args.store}")
    return 0
