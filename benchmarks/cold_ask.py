"""A cold `cagkit ask`: the first token of a new process, which is what every command-line question pays, and the
two costs of a new process that a warm one (`cagkit bench`, `cagkit serve`) never shows.

    python benchmarks/cold_ask.py [--model qwen] [--store stores/examples-qwen] [--question Q] [--mode stored]
        [--repeats 3] [--threads 1] [--out results/cold-ask-qwen.json]

Each round, side by side and in fresh processes:

- `ask, prefix prefilled`: `cagkit ask --json` with an empty prompt-prefix store, so the process prefills the
  chat template's prefix before it places the document (what every ask did before the prefix's KV was kept on
  disk, `cagkit.kv.prefill.saved_prefix_path`);
- `ask, prefix read`: the same ask again, the prefix's KV now read from where the first one wrote it;
- `embedder, sentence-transformers` and `embedder, cagkit`: a process that has imported torch, transformers' auto
  classes and cagkit's embeddings module (as `ask` has by then) builds the retrieval embedder and embeds the
  question, through sentence-transformers as cagkit did before, or through `cagkit.retrieval.embeddings`
  (transformers alone); the clock starts after those imports.

The prompt-prefix store is swapped by pointing `$CAGKIT_HOME` at a temporary folder whose `models` is a link to the
real one: the converted weights are shared, nothing of the real home is written or removed. Each ask's
`timings` are kept whole (retrieve, load, place, prefill, first token); the file records the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from cagkit.bench import cagkit_command, run_timed, write_results
from cagkit.models.registry import cagkit_home

QUESTION = "How does cagkit make a stored chunk usable at any position in the prompt?"

EMBED = """
import json, sys, time
import torch
import transformers.modeling_utils  # noqa: F401 - imported by then in an ask, whose model is loaded
from transformers import AutoModel, AutoTokenizer, PreTrainedTokenizerFast  # noqa: F401
from cagkit.retrieval.embeddings import _model_dir, embed_query
torch.set_num_threads(int(sys.argv[2]))
started = time.perf_counter()
if sys.argv[1] == "sentence-transformers":
    from sentence_transformers import SentenceTransformer
    vector = SentenceTransformer(str(_model_dir()), device="cpu", local_files_only=True).encode(
        [sys.argv[3]], normalize_embeddings=True)[0]
else:
    vector = embed_query(sys.argv[3])
print(json.dumps({"ms": (time.perf_counter() - started) * 1e3, "vector": [float(x) for x in vector]}))
"""


def home_with_models(root: Path) -> dict:
    """The environment of a process whose $CAGKIT_HOME is `root`, holding a link to the real converted models."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "models").symlink_to(cagkit_home() / "models", target_is_directory=True)
    return {**os.environ, "CAGKIT_HOME": str(root)}


def ask(args, env: dict) -> dict:
    cmd = [*cagkit_command(), "ask", "--store", args.store, "--model", args.model, "--mode", args.mode,
           "--top-k", "1", "--json", "--threads", str(args.threads), args.question]
    proc, seconds = run_timed(cmd, env=env)
    if proc.returncode:
        raise SystemExit(f"cagkit ask failed ({proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")
    answer = json.loads(proc.stdout)
    return {"answer": answer["answer"], "timings": answer["timings"], "process_s": round(seconds, 2)}


def embedder(args, way: str) -> dict:
    proc, _ = run_timed([sys.executable, "-c", EMBED, way, str(args.threads), args.question])
    if proc.returncode:
        raise SystemExit(f"embedder ({way}) failed: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen")
    ap.add_argument("--store", default="stores/examples-qwen", help="a store written by --model (make demo's)")
    ap.add_argument("--question", default=QUESTION)
    ap.add_argument("--mode", default="stored")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not Path(args.store).is_dir():
        raise SystemExit(f"{args.store}: no such store; run `make demo` (or give --store, written by --model)")
    rows = {"ask, prefix prefilled": [], "ask, prefix read": [], "embedder, sentence-transformers": [],
            "embedder, cagkit": []}
    cosines = []
    with tempfile.TemporaryDirectory(prefix="cagkit-cold-") as tmp:
        for round_ in range(args.repeats):
            env = home_with_models(Path(tmp) / f"home-{round_}")
            rows["ask, prefix prefilled"].append(ask(args, env))
            rows["ask, prefix read"].append(ask(args, env))
            ways = ["sentence-transformers", "cagkit"][:: 1 if round_ % 2 == 0 else -1]
            got = {way: embedder(args, way) for way in ways}
            for way in ways:
                rows[f"embedder, {way}"].append({"ms": round(got[way]["ms"], 1)})
            a, b = got["sentence-transformers"]["vector"], got["cagkit"]["vector"]
            cosines.append(sum(x * y for x, y in zip(a, b)))
            print(f"round {round_ + 1}: " + ", ".join(
                f"{k} {v[-1]['timings']['ttft_ms'] if 'timings' in v[-1] else v[-1]['ms']:.0f} ms"
                for k, v in rows.items()), flush=True)
    medians = {}
    for name, runs in rows.items():
        if "timings" in runs[0]:
            medians[name] = {part: round(statistics.median(r["timings"][part] for r in runs), 1)
                             for part in ("retrieve_ms", "load_ms", "place_ms", "prefill_ms", "ttft_ms")}
        else:
            medians[name] = {"ms": round(statistics.median(r["ms"] for r in runs), 1)}
    same = len({r["answer"] for runs in list(rows.values())[:2] for r in runs}) == 1
    for name, m in medians.items():
        print(f"{name:>32}: " + ", ".join(f"{k} {v}" for k, v in m.items()))
    print(f"the same answer in every ask: {same}; embedders' question vectors, least cosine {min(cosines):.7f}")
    if args.out:
        write_results(Path(args.out), {"benchmark": "cold_ask", "model": args.model, "store": args.store,
                                       "question": args.question, "mode": args.mode, "repeats": args.repeats,
                                       "threads": args.threads, "medians": medians, "same_answer": same,
                                       "embedder_least_cosine": round(min(cosines), 7), "rounds": rows})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
