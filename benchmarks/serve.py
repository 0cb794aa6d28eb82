"""`cagkit serve` against `cagkit ask`: time to the first answer token, and answers per second under load.

    python benchmarks/serve.py --store /tmp/serve-bench-store [--model smollm2] [--threads 1] [--repeats 3]
        [--concurrency 1,4,8] [--requests 16] [--max-tokens 32] [--out docs/serve-benchmark.json]

Needs a store (`cagkit ingest examples/docs --store /tmp/serve-bench-store`) and the serve extra. Measures, in
this order, with nothing else of this script running meanwhile:

- fresh process: `cagkit ask` started `--repeats` times; the time from starting the process to the first byte of
  the answer on its stdout (imports, model load, retrieval, context and prefill: what a script that shells out to
  `cagkit ask` waits for), and to the process's exit.
- warm server: one `cagkit serve` process started once (its start-up time is recorded apart); `--repeats`
  streamed chat requests one after another, each timed from sending it to the first content chunk on the wire.
- load: for each `--concurrency` C, `--requests` non-streamed chat requests sent by C client threads at once;
  requests per second (requests / wall time), median and 95th-percentile latency, answer tokens per second.
- documents (with `--document ID`, the store written by `--model`): warm document caches. Questions restricted to
  that one document, `mode` stored at document scope: after a warm-up question at chunk scope (which is not kept,
  and leaves the prompt prefix prefilled once, as a running server has it), the first question reads and places
  the document, the
  `--repeats` after it find it kept (`--cache-bytes`); then `--requests` questions on it from the largest
  `--concurrency` clients at once. The server's own first-token time and its parts (load, place, prefill) for each,
  and the ratio of the repeated questions' median to the first's. This phase runs first, on a fresh server.

`--phases` picks which run (default: fresh, warm and load; documents needs `--document`).

The questions rotate through a fixed list about the example documents, so no two requests in a row are the same.
Every request uses cagkit's defaults (top 4 chunks, hybrid retrieval, the default placement) and `--max-tokens`.
`--threads` goes to both `cagkit ask` and `cagkit serve` (and OMP_NUM_THREADS), so the two compare at equal
CPU. The results are written to `--out` as JSON and printed; docs/serve.md links that file rather than copying
its figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from cagkit.bench import ServerFailed, ServerProcess, Timer, cagkit_command, summary, write_results

BOOK_QUESTIONS = (  # for --document: questions about a long text; the answer's content does not matter here
    "Who is the main character of this story?",
    "Where does the story take place?",
    "What happens at the beginning?",
    "Which people are named first?",
    "What is the weather like?",
    "What does the detective notice?",
)
QUESTIONS = (
    "How does cagkit make a stored chunk usable at any position in the prompt?",
    "What does the store keep for each document?",
    "What is a translator and what does it learn?",
    "Which command adds documents to the store?",
    "Why are keys stored without rotary positions?",
    "What does the blend option recompute?",
    "How does cagkit choose the chunks for a question?",
    "What happens when a document changes and is ingested again?",
)


def fresh_ask(args, env) -> dict:
    """Wall seconds from starting `cagkit ask` to the first byte of its answer, and to its exit."""
    first, total = [], []
    for i in range(args.repeats):
        question = QUESTIONS[i % len(QUESTIONS)]
        cmd = [*cagkit_command(), "ask", question, "--store", args.store, "--model", args.model, "--max-new-tokens",
               str(args.max_tokens), "--threads", str(args.threads)]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        byte = proc.stdout.read(1)  # the answer streams to stdout; nothing else is printed before it
        got = time.perf_counter()
        out, err = proc.communicate()
        end = time.perf_counter()
        if proc.returncode != 0 or not byte:
            raise SystemExit(f"cagkit ask failed ({proc.returncode}): {err.decode()[-2000:]}")
        first.append(got - start)
        total.append(end - start)
    return {"first_token_s": summary(first), "process_s": summary(total)}


def warm_first_token(httpx, url: str, args) -> dict:
    """Seconds from sending a streamed chat request to its first content chunk, one request at a time."""
    first, server_ttft = [], []
    for i in range(args.repeats):
        body = {"model": args.model, "stream": True, "max_tokens": args.max_tokens,
                "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]}
        start = time.perf_counter()
        got = None
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                delta = event["choices"][0].get("delta", {}) if event.get("choices") else {}
                if got is None and delta.get("content"):
                    got = time.perf_counter()
                if "cagkit" in event:
                    server_ttft.append(event["cagkit"]["timings"]["ttft_ms"] / 1e3)
        if got is None:
            raise SystemExit("the server streamed no answer text; is the store empty?")
        first.append(got - start)
    return {"first_token_s": summary(first), "server_ttft_s": summary(server_ttft)}


def documents(httpx, url: str, args, clients: int) -> dict:
    """The first question on `--document` (placed, then kept), `--repeats` more one at a time (warm), then
    `--requests` from `clients` threads at once: the server's first-token time and its parts for each."""
    def ask(i: int, scope: str = "document") -> dict:
        body = {"model": args.model, "max_tokens": 1, "mode": "stored", "scope": scope,
                "documents": [args.document],
                "messages": [{"role": "user", "content": BOOK_QUESTIONS[i % len(BOOK_QUESTIONS)]}]}
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
        if response.status_code != 200:
            raise SystemExit(f"request failed ({response.status_code}): {response.text[:300]}")
        part = response.json()["cagkit"]
        t = part["timings"]
        return {"warm": part["warm"], "documents": part["documents"], "context_tokens": part["context_tokens"],
                **{k: round(t[k], 1) for k in ("ttft_ms", "load_ms", "place_ms", "prefill_ms", "queue_ms")}}

    warm_up = ask(0, "chunks")  # the model's prompt prefix prefilled once and its kernels warm; blend 0.15: not kept
    first = ask(0)
    repeated = [ask(i) for i in range(1, args.repeats + 1)]
    with ThreadPoolExecutor(clients) as pool:
        together = list(pool.map(ask, range(args.requests)))
    median = statistics.median(r["ttft_ms"] for r in repeated)
    return {"document": args.document, "warm_up": warm_up, "first": first, "repeated": repeated, "clients": clients,
            "together": together, "repeated_ttft_ms_median": median,
            "repeated_over_first": round(median / first["ttft_ms"], 3),
            "together_ttft_ms_median": statistics.median(r["ttft_ms"] for r in together),
            "together_warm": sum(r["warm"] for r in together)}


def load(httpx, url: str, args, clients: int) -> dict:
    """`--requests` chat requests from `clients` threads at once: requests/s and latency."""
    latencies, tokens, errors = [], [], []
    lock = threading.Lock()

    def one(i: int) -> None:
        body = {"model": args.model, "max_tokens": args.max_tokens,
                "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]}
        start = time.perf_counter()
        response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
        took = time.perf_counter() - start
        with lock:
            if response.status_code != 200:
                errors.append(f"{response.status_code}: {response.text[:200]}")
            else:
                latencies.append(took)
                tokens.append(response.json()["usage"]["completion_tokens"])

    with Timer() as timer, ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(args.requests)))
    wall = timer.seconds
    if errors:
        raise SystemExit(f"{len(errors)} requests failed at concurrency {clients}: {errors[0]}")
    ordered = sorted(latencies)
    return {"clients": clients, "requests": args.requests, "wall_s": round(wall, 3),
            "requests_per_s": round(args.requests / wall, 3),
            "latency_p50_s": round(statistics.median(ordered), 3),
            "latency_p95_s": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
            "answer_tokens_per_s": round(sum(tokens) / wall, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--store", required=True, help="a store made by `cagkit ingest`")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--threads", type=int, default=1, help="CPU threads for each cagkit process (default: 1)")
    p.add_argument("--repeats", type=int, default=3, help="first-token measurements of each kind (default: 3)")
    p.add_argument("--concurrency", default="1,4,8", help="client threads per load run (default: 1,4,8)")
    p.add_argument("--requests", type=int, default=16, help="requests per load run (default: 16)")
    p.add_argument("--max-tokens", type=int, default=32, help="longest answer in tokens (default: 32)")
    p.add_argument("--out", default="docs/serve-benchmark.json")
    p.add_argument("--phases", default="fresh,warm,load", help="which to run, of fresh, warm, load, documents")
    p.add_argument("--document", default=None, help="the stored document the documents phase asks about")
    p.add_argument("--cache-bytes", default="2G", help="the server's --cache-bytes (default: 2G)")
    args = p.parse_args()
    phases = set(args.phases.split(","))
    if "documents" in phases and not args.document:
        raise SystemExit("the documents phase needs --document ID (a document of --store written by --model)")
    try:
        import httpx
    except ImportError:
        raise SystemExit("the benchmark needs httpx: pip install 'cagkit[dev]'") from None
    if not (Path(args.store) / "manifest.sqlite").exists():
        raise SystemExit(f"no store at {args.store}; make one with `cagkit ingest examples/docs --store {args.store}`")
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    levels = [int(c) for c in args.concurrency.split(",")]

    results = {"benchmark": "benchmarks/serve.py"}
    write_results(args.out, results, device="cpu")  # the command, the date and the machine, as the run starts
    results |= {
        "settings": {"model": args.model, "store": args.store, "threads": args.threads, "repeats": args.repeats,
                     "requests": args.requests, "max_tokens": args.max_tokens, "concurrency": levels,
                     "phases": sorted(phases), "document": args.document, "cache_bytes": args.cache_bytes},
    }
    if "fresh" in phases:
        print(f"cagkit ask in a fresh process, {args.repeats} runs ...", flush=True)
        results["fresh_ask"] = fresh_ask(args, env)
    server = ServerProcess("--store", args.store, "--models", args.model, "--max-loaded", "1", "--threads",
                           str(args.threads), "--cache-bytes", args.cache_bytes, env=env,
                           log_prefix="cagkit-serve-bench")
    try:
        try:
            results["server_startup_s"] = round(server.wait(), 3)
        except ServerFailed as exc:
            raise SystemExit(str(exc)) from None
        print(f"server up in {results['server_startup_s']:.1f} s", flush=True)
        if "documents" in phases:
            print(f"documents: {args.document}, first question, {args.repeats} repeats, {args.requests} from "
                  f"{max(levels)} clients ...", flush=True)
            results["documents"] = documents(httpx, server.url, args, max(levels))
            write_results(args.out, results)
        if "warm" in phases:
            print(f"warm first token, {args.repeats} runs ...", flush=True)
            results["warm_server"] = warm_first_token(httpx, server.url, args)
        if "load" in phases:
            results["load"] = []
            for clients in levels:
                print(f"load: {args.requests} requests from {clients} clients ...", flush=True)
                results["load"].append(load(httpx, server.url, args, clients))
    finally:
        server.stop()
    results["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    write_results(args.out, results)
    if "documents" in results:
        d = results["documents"]
        print(f"\n{args.model}, {d['document']} ({d['first']['context_tokens']} tokens): first question "
              f"{d['first']['ttft_ms'] / 1e3:.2f} s (load {d['first']['load_ms']:.0f} ms, place "
              f"{d['first']['place_ms']:.0f} ms, prefill {d['first']['prefill_ms']:.0f} ms); repeated, warm: median "
              f"{d['repeated_ttft_ms_median'] / 1e3:.2f} s ({d['repeated_over_first']:.2f}x the first); "
              f"{len(d['together'])} from {d['clients']} clients at once: median {d['together_ttft_ms_median'] / 1e3:.2f} "
              f"s, {d['together_warm']} warm")
    if "fresh_ask" not in results or "warm_server" not in results:
        print(f"\nwritten to {args.out}")
        return

    fresh, warm = results["fresh_ask"], results["warm_server"]
    print(f"\n{args.model}, {args.threads} thread(s), answers up to {args.max_tokens} tokens; medians of "
          f"{args.repeats} runs")
    print(f"  first token, `cagkit ask` in a fresh process: {fresh['first_token_s']['median']:.3f} s "
          f"(process exits after {fresh['process_s']['median']:.3f} s)")
    print(f"  first token, warm `cagkit serve` (streamed):  {warm['first_token_s']['median']:.3f} s "
          f"(server's own ttft {warm['server_ttft_s']['median']:.3f} s; start-up {results['server_startup_s']:.1f} s)")
    print("  clients  requests/s  p50 latency s  p95 latency s  answer tokens/s")
    for row in results.get("load", []):
        print(f"  {row['clients']:>7}  {row['requests_per_s']:>10.3f}  {row['latency_p50_s']:>13.3f}  "
              f"{row['latency_p95_s']:>13.3f}  {row['answer_tokens_per_s']:>15.2f}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
