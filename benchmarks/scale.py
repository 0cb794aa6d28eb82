"""cagkit past one machine, measured on one: ingest throughput of the local ingest against `ingest --ray` with 1 and
2 actors, and the first token of `ask` reading its KV from a store on S3 against the same store on local disk.

    python benchmarks/scale.py [--tokens 40000] [--source smollm2] [--target gemma] [--asks 6]

- Documents: the first `--tokens` source tokens of the Gutenberg test books in `$CAGKIT_DATA/corpus` (default
  ../shared/data), cut into documents of about 2,000 tokens, written to a temporary folder.
- Ingest: each run in a fresh process, into a fresh store: `local-sqlite` (the default store), `local-lance` (the
  same ingest into a LanceDB store), `ray-1` and `ray-2` (`ingest --ray` with a local Ray and 1 or 2 actors, into a
  LanceDB store on local disk) and `ray-2-s3` (2 actors into a store on an S3-compatible server, moto, on this
  machine). Recorded: tokens, the ingest's own seconds (`IngestReport.seconds`: from the opened store to the last
  commit; for Ray it includes starting Ray and loading the model in each actor) and the process's wall time
  (everything, model load included), and tokens/s by each.
- Ask: the store written by `local-sqlite` copied to S3 (`cagkit store migrate`), then `--asks` questions asked
  of the `local-lance` store and of the S3 copy in turn (ABAB, one process, the model loaded once), the default mode;
  median `ttft_ms` and `load_ms` (reading the retrieved chunks' KV) of each, and their ratio.

The machine is shared and has 2 cores: the figures are ratios within this run, and the load average at the start
and end is recorded beside them. Results: docs/results/scale.json; a run of some parts (`--runs`, `--asks 0`)
keeps the other parts' results there, each part with the command that made it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from cagkit.bench import command_line, run_timed, write_results

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ["Who is Father Brown?", "What does the priest carry?", "Where does the story take place?",
             "Who is Macbeth?", "What do the witches say?", "Who kills Duncan?"]


def make_documents(folder: Path, tokens: int, source: str) -> int:
    from cagkit.models.loading import load_model

    lm = load_model(source, "cpu")
    books = sorted((Path(os.environ.get("CAGKIT_DATA", ROOT.parent / "shared" / "data")) / "corpus" / "gutenberg"
                    / "testing").glob("*.txt"))
    folder.mkdir(parents=True, exist_ok=True)
    total, n = 0, 0
    for book in books:
        paragraphs = [p for p in book.read_text(errors="replace").split("\n\n") if p.strip()]
        current, count = [], 0
        for p in paragraphs:
            current.append(p)
            count += lm.count_tokens(p)
            if count >= 2000:
                (folder / f"{book.stem}-{n:03d}.txt").write_text("\n\n".join(current))
                total, n, current, count = total + count, n + 1, [], 0
                if total >= tokens:
                    return total
    return total


def run_ingest(kind: str, docs: Path, store: str, source: str, env: dict) -> dict:
    code = f"""
import json, time
t = time.perf_counter()
kind = {kind!r}
if kind.startswith("ray"):
    from cagkit.ingest.distributed import ingest_ray
    r = ingest_ray([{str(docs)!r}], {store!r}, actors=int(kind.split("-")[1]), source={source!r}, progress=False)
else:
    from cagkit.ingest.pipeline import ingest
    r = ingest([{str(docs)!r}], store={store!r}, source={source!r}, progress=False,
               manifest="lance" if kind == "local-lance" else "sqlite")
print(json.dumps({{"tokens": r.tokens, "chunks": r.chunks, "documents": len(r.added), "ingest_s": r.seconds,
                  "process_s": time.perf_counter() - t}}))
"""
    out, wall_s = run_timed([sys.executable, "-c", code], env=env)
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed: {out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall_s
    result["tokens_per_s_ingest"] = result["tokens"] / result["ingest_s"]
    result["tokens_per_s_wall"] = result["tokens"] / result["wall_s"]
    print(kind, json.dumps(result), file=sys.stderr, flush=True)
    return result


def run_asks(local: str, remote: str, target: str, asks: int) -> dict:
    from cagkit.ask import ask

    timings = {"local": [], "s3": []}
    ask(QUESTIONS[0], store=local, model=target, max_new_tokens=2)  # loads the model; not counted
    for i in range(asks):
        question = QUESTIONS[i % len(QUESTIONS)]
        for where, store in (("local", local), ("s3", remote)) if i % 2 == 0 else (("s3", remote), ("local", local)):
            answer = ask(question, store=store, model=target, max_new_tokens=2)
            timings[where].append({k: answer.timings[k] for k in ("retrieve_ms", "load_ms", "ttft_ms")})
    summary = {}
    for where, rows in timings.items():
        summary[where] = {f"{k}_median": statistics.median(r[k] for r in rows) for k in rows[0]}
    summary["ttft_ratio_s3_to_local"] = summary["s3"]["ttft_ms_median"] / summary["local"]["ttft_ms_median"]
    summary["questions"] = asks
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=40000)
    ap.add_argument("--source", default="smollm2")
    ap.add_argument("--target", default="gemma")
    ap.add_argument("--asks", type=int, default=6)
    ap.add_argument("--runs", default="local-sqlite,local-lance,ray-1,ray-2,ray-2-s3")
    ap.add_argument("--ask-only", action="store_true", help="measure the asks alone: the two local stores they need "
                                                            "are ingested but not recorded")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "scale.json"))
    args = ap.parse_args()

    from lab.s3server import S3Server

    work = Path(tempfile.mkdtemp(prefix="cagkit-scale-"))
    server = S3Server(work)
    os.environ.update({k: server.env[k] for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                  "AWS_DEFAULT_REGION")})
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    try:
        tokens = make_documents(work / "docs", args.tokens, args.source)
        command = command_line()
        result = {"command": command, "source": args.source, "target": args.target, "document_tokens": tokens,
                  "load_average_start": os.getloadavg(), "ingest": {}}
        bucket = server.bucket_url("scale")
        for kind in "local-sqlite,local-lance".split(",") if args.ask_only else args.runs.split(","):
            store = f"{bucket}/{kind}" if kind.endswith("-s3") else str(work / kind)
            measured = run_ingest(kind, work / "docs", store, args.source, env)
            if not args.ask_only:
                result["ingest"][kind] = measured
        base = result["ingest"].get("local-sqlite")
        if base:
            for kind, r in result["ingest"].items():
                r["ingest_speedup_vs_local_sqlite"] = r["tokens_per_s_ingest"] / base["tokens_per_s_ingest"]
                r["wall_speedup_vs_local_sqlite"] = r["tokens_per_s_wall"] / base["tokens_per_s_wall"]
        if (args.ask_only or "local-lance" in result["ingest"]) and args.asks:
            from cagkit.store.lance import migrate

            remote = f"{bucket}/ask"
            migrate(str(work / "local-sqlite"), remote)  # the same documents and KV as local-lance's store
            result["ask"] = run_asks(str(work / "local-lance"), remote, args.target, args.asks)
        result["load_average_end"] = os.getloadavg()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    if out.exists():  # a run of some parts only keeps the others' results, each with the command that made it
        previous = json.loads(out.read_text())
        for kind, r in previous.get("ingest", {}).items():
            result["ingest"].setdefault(kind, r)
        if result.get("ask") is None:
            result["ask"] = previous.get("ask")
    for part in [*result["ingest"].values(), result.get("ask") or {}]:
        part.setdefault("command", command)
    write_results(out, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
