"""`cagkit store info|verify|repair|migrate|remove`: what a store holds (`Store.summary`), whether every part of it
is intact (`Store.verify`), rebuild what is not (`cagkit.ingest.pipeline.repair`), copy it into a LanceDB store
(`cagkit.store.lance.migrate`), or drop documents from it (`cagkit.ingest.pipeline.remove`)."""

from __future__ import annotations

import json
import sys

from cagkit.cli.options import add_device_options, add_store_option


def add_parser(sub) -> None:
    p = sub.add_parser("store", help="what a store holds, check, repair or migrate it, or drop documents from it")
    ssub = p.add_subparsers(dest="store_command", required=True)
    t = ssub.add_parser("info", help="the store's settings and, per document, chunks, tokens, KV size and state",
                        epilog="exit status: 0 when every document is intact, 1 when some are damaged (a KV file is "
                               "missing or does not parse, or a chunk's tensors do not match their checksum, as "
                               "`store verify` finds; with --quick only the KV files' headers are read)")
    add_store_option(t)
    t.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    t.add_argument("--quick", action="store_true",
                   help="read only each KV file's header, not every chunk's tensors: quick on a big store, but "
                        "tensor bytes changed under an intact header show as ok")
    t.set_defaults(func=run_info)
    t = ssub.add_parser("verify", help="check the manifest, every KV file and every chunk's checksum",
                        epilog="exit status: 0 when the manifest and every document are intact (orphaned files an "
                               "interrupted ingest left are listed, and removed by the next write), 1 when something "
                               "is damaged (each damaged document is listed; `cagkit store repair` rebuilds them)")
    add_store_option(t)
    t.add_argument("--json", action="store_true", help="print the findings as one JSON object")
    t.set_defaults(func=run_verify)
    t = ssub.add_parser("repair", help="re-ingest damaged documents whose files still exist and remove KV files "
                                       "cagkit left that no document uses",
                        epilog="exit status: 0 when the store is intact after it, 1 when some damaged documents could "
                               "not be rebuilt (each is named with what to do)")
    add_store_option(t)
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--wait", action="store_true", help="when another cagkit process is writing the store, wait for it")
    add_device_options(t)
    t.set_defaults(func=run_repair)
    t = ssub.add_parser("migrate", help="copy a store into a LanceDB store at a URL (s3://bucket/prefix) or a new "
                                        "folder, KV as stored, no model run",
                        epilog="exit status: 0 when every document was copied or was there already, 1 when some "
                               "damaged documents were left out (each is named; repair the store and migrate again)")
    add_store_option(t)
    t.add_argument("--to", required=True, metavar="URL", help="the LanceDB store to copy into: s3://bucket/prefix "
                                                              "(with AWS_ENDPOINT_URL for a service other than AWS) "
                                                              "or a local folder")
    t.add_argument("--dtype", default=None, choices=["float16", "bfloat16", "int8", "int4"],
                   help="hold the copy's KV in this dtype, quantized from the stored KV as it is copied (int8, int4: "
                        "a compressed store without prefilling again; default: as stored)")
    t.set_defaults(func=run_migrate)
    t = ssub.add_parser("remove", help="drop documents (by file, or every one under a folder) without re-ingesting")
    t.add_argument("paths", nargs="+", help="stored documents: their files or folders, or ids given to ingest_texts")
    add_store_option(t)
    t.set_defaults(func=run_remove)


def run_migrate(args) -> int:
    from cagkit.store.lance import migrate

    done = migrate(args.store, args.to, dtype=args.dtype)
    for path in done["damaged"]:
        print(f"left out {path}: damaged; `cagkit store repair --store {args.store}` rebuilds it, then migrate again",
              file=sys.stderr)
    print(f"{len(done['copied'])} copied, {len(done['unchanged'])} there already, {len(done['damaged'])} left out "
          f"-> {args.to}")
    return 1 if done["damaged"] else 0


def run_info(args) -> int:
    from cagkit.store.store import Store

    with Store.open(args.store) as st:
        info = st.summary(checksums=not args.quick)
    damaged = sum(d["state"] != "ok" for d in info["per_document"])
    if args.json:
        print(json.dumps(info))
        return 1 if damaged else 0
    s = info["settings"]
    per_token = f", {info['kv_bytes_per_token']:,.0f} KV bytes a token" if info["kv_bytes_per_token"] else ""
    print(f"{info['store']}: {info['documents']} documents, {info['chunks']} chunks, {info['tokens']} tokens, "
          f"{info['bytes'] / 1e6:.1f} MB{per_token}")
    print(f"source {s['source']} (fingerprint {s['source_fingerprint']}), {s['dtype']} KV, chunks of at most "
          f"{s['chunk_tokens']} tokens, embedder {s['embedder']}, format {s['format_version']}")
    if info["per_document"]:
        print(f"\n{'chunks':>6} {'tokens':>7} {'KV MB':>7}  {'state':<12}  {'prefilled':<19}  document")
    for d in info["per_document"]:
        read = f"whole, window {d['window']}" if d.get("prefill") == "document" else "chunk by chunk"
        print(f"{d['chunks']:>6} {d['tokens']:>7} {d['kv_bytes'] / 1e6:>7.1f}  {d['state']:<12}  {read:<19}  {d['path']}")
    if damaged:
        print(f"\n{damaged} of {info['documents']} documents are damaged; `cagkit store repair --store {args.store}` "
              f"rebuilds them (`cagkit store verify` names what is wrong with each)")
    return 1 if damaged else 0


def run_verify(args) -> int:
    from cagkit.store.store import DamagedManifestError, Store

    try:
        with Store.open(args.store) as st:
            found = st.verify()
    except DamagedManifestError as exc:  # damaged, not an error of the command: reported as a finding
        found = {"store": str(args.store), "ok": False, "manifest": str(exc), "documents": [], "damaged": [],
                 "orphans": [], "missing": [], "foreign": []}
    if args.json:
        print(json.dumps(found))
        return 0 if found["ok"] else 1
    print(f"{found['store']}: manifest {found['manifest']}; {len(found['documents'])} documents, "
          f"{len(found['damaged'])} damaged, {len(found['orphans'])} orphaned KV files, "
          f"{len(found['missing'])} missing KV files")
    for d in found["documents"]:
        if d["state"] != "ok":
            problems = d["problems"]
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            print(f"damaged {d['path']}: {'; '.join(problems[:3])}{more}")
    for name in found["orphans"]:
        print(f"orphan kv/{name}: left by an interrupted cagkit write, used by no document (the next ingest or "
              f"repair removes it)")
    for name in found["foreign"]:
        print(f"not cagkit's: kv/{name} (left alone)")
    if not found["ok"]:
        print(f"`cagkit store repair --store {args.store}` rebuilds damaged documents whose files still exist and "
              f"removes orphaned files", file=sys.stderr)
    return 0 if found["ok"] else 1


def run_repair(args) -> int:
    from cagkit.ingest.pipeline import repair

    found, report = repair(args.store, progress=not args.quiet, device=args.device, wait=args.wait)
    for path in report.updated:
        print(f"rebuilt {path}")
    for name in report.orphans:
        print(f"removed kv/{name} (written by cagkit, used by no document)")
    for path, reason in report.failed:
        print(f"not rebuilt {path}: {reason}", file=sys.stderr)
    print(f"{len(report.updated)} of {len(found['damaged'])} damaged documents rebuilt, {len(report.orphans)} orphaned "
          f"files removed -> {args.store}")
    return 1 if report.failed else 0


def run_remove(args) -> int:
    from cagkit.ingest.pipeline import remove

    removed = remove(args.paths, store=args.store)
    for path in removed:
        print(f"removed {path}")
    print(f"{len(removed)} document{'s' * (len(removed) != 1)} removed from {args.store}")
    return 0
