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
    args = p.parse_args()
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
                     "requests": args.requests, "max_tokens": args.max_tokens, "concurrency": levels},
    }
    print(f"cagkit ask in a fresh process, {args.repeats} runs ...", flush=True)
    results["fresh_ask"] = fresh_ask(args, env)
    server = ServerProcess("--store", args.store, "--models", args.model, "--max-loaded", "1", "--threads",
                           str(args.threads), env=env, log_prefix="cagkit-serve-bench")
    try:
        try:
            results["server_startup_s"] = round(server.wait(), 3)
        except ServerFailed as exc:
            raise SystemExit(str(exc)) from None
        print(f"server up in {results['server_startup_s']:.1f} s; warm first token, {args.repeats} runs ...",
              flush=True)
        results["warm_server"] = warm_first_token(httpx, server.url, args)
        results["load"] = []
        for clients in levels:
            print(f"load: {args.requests} requests from {clients} clients ...", flush=True)
            results["load"].append(load(httpx, server.url, args, clients))
    finally:
        server.stop()
    results["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    write_results(args.out, results)

    fresh, warm = results["fresh_ask"], results["warm_server"]
    print(f"\n{args.model}, {args.threads} thread(s), answers up to {args.max_tokens} tokens; medians of "
          f"{args.repeats} runs")
    print(f"  first token, `cagkit ask` in a fresh process: {fresh['first_token_s']['median']:.3f} s "
          f"(process exits after {fresh['process_s']['median']:.3f} s)")
    print(f"  first token, warm `cagkit serve` (streamed):  {warm['first_token_s']['median']:.3f} s "
          f"(server's own ttft {warm['server_ttft_s']['median']:.3f} s; start-up {results['server_startup_s']:.1f} s)")
    print("  clients  requests/s  p50 latency s  p95 latency s  answer tokens/s")
    for row in results["load"]:
        print(f"  {row['clients']:>7}  {row['requests_per_s']:>10.3f}  {row['latency_p50_s']:>13.3f}  "
              f"{row['latency_p95_s']:>13.3f}  {row['answer_tokens_per_s']:>15.2f}")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
