"""Crash safety of ingest, for real: `cagkit ingest` killed with SIGKILL at random moments, the store verified after
each kill, then ingested to the end, verified, and asked.

A tiny random Llama (saved once as a model folder, with SmolLM2's tokenizer, so it needs no download) prefills
small documents and one long one in short parts, so kills land in start-up, in prefill, between the parts of the
long document and in commits. After each kill `cagkit store verify` must pass (orphaned parts an interrupted
ingest leaves are allowed: the next write removes them); after the final ingest every document must be in the
store exactly once, nothing orphaned, and `cagkit ask` must answer. Prints one line per kill and writes a JSON
summary.

    python benchmarks/kill_ingest.py --kills 20 --out results/kill_ingest.json   # about 10 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from cagkit.bench import cagkit_command, run_timed, write_results

SENTENCE = ("The ferry to Orlimar leaves at {h} o'clock from pier {p}, and the lighthouse beside it flashes green "
            "every {s} seconds. ")


def cagkit(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_timed([*cagkit_command(), *args], env=env, timeout=timeout)[0]


def make_model(folder: Path) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer, saved as a model folder `--source` and `--model` take."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from cagkit.models.registry import convert

    tokenizer = AutoTokenizer.from_pretrained(convert("smollm2"))
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=len(tokenizer), max_position_embeddings=4096,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_documents(folder: Path, small: int, long_sentences: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(small):
        path = folder / f"note-{i:02d}.txt"
        path.write_text(SENTENCE.format(h=i % 12 + 1, p=i, s=i % 9 + 2) * 3)
        paths.append(path)
    path = folder / "zz-long.txt"  # last, so kills land between small documents and within the long one
    path.write_text("".join(SENTENCE.format(h=i % 12 + 1, p=i, s=i % 9 + 2) for i in range(long_sentences)))
    return paths + [path]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="SIGKILLs at random moments (default: %(default)s)")
    parser.add_argument("--max-delay", type=float, default=40.0,
                        help="latest kill, in seconds after the ingest starts (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments (default: %(default)s)")
    parser.add_argument("--out", default="results/kill_ingest.json", help="summary JSON (default: %(default)s)")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="cagkit-kill-"))
    model = make_model(work / "tiny-model")
    docs = make_documents(work / "docs", small=30, long_sentences=400)
    store = work / "store"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CAGKIT_DEVICE": "cpu"}
    ingest = ["ingest", str(work / "docs"), "--store", str(store), "--source", str(model), "--chunk-tokens", "64",
              "--quiet"]
    kills, failures = [], []
    for n in range(args.kills):
        delay = rng.uniform(0.5, args.max_delay)
        proc = subprocess.Popen([*cagkit_command(), *ingest], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=delay)
            finished = True
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            finished = False
        record = {"kill": n + 1, "delay_s": round(delay, 2), "finished_before_kill": finished}
        if (store / "manifest.sqlite").exists():
            verify = cagkit("store", "verify", "--store", str(store), "--json", env=env)
            report = json.loads(verify.stdout) if verify.stdout.strip() else {}
            record.update(verify_exit=verify.returncode, damaged=report.get("damaged"),
                          orphans=len(report.get("orphans") or []), documents=len(report.get("documents") or []))
            if verify.returncode != 0:
                failures.append(record)
        else:
            record.update(verify_exit=None, note="killed before the store was created")
        kills.append(record)
        print(json.dumps(record), flush=True)
        if finished:  # the whole ingest got through: start again from an empty store, so kills keep landing
            subprocess.run(["rm", "-rf", str(store)], check=True)

    final = cagkit(*ingest, env=env)
    verify = cagkit("store", "verify", "--store", str(store), "--json", env=env)
    info = json.loads(cagkit("store", "info", "--store", str(store), "--json", env=env).stdout)
    stored = [d["path"] for d in info["per_document"]]
    expected = sorted(str(p.resolve()) for p in docs)
    answer = cagkit("ask", "When does the ferry to Orlimar leave?", "--store", str(store), "--model", str(model),
                    "--max-new-tokens", "4", "--json", env=env)
    summary = {
        "kills": kills,
        "final_ingest_exit": final.returncode,
        "final_verify_exit": verify.returncode,
        "final_verify": json.loads(verify.stdout) if verify.stdout.strip() else None,
        "every_document_once": sorted(stored) == expected,
        "ask_exit": answer.returncode,
        "failures": failures,
    }
    ok = (not failures and final.returncode == 0 and verify.returncode == 0 and summary["every_document_once"]
          and answer.returncode == 0)
    summary["ok"] = ok
    out = write_results(args.out, summary)
    print(f"{len(kills)} kills, {len(failures)} failed verifies; final ingest exit {final.returncode}, verify exit "
          f"{verify.returncode}, every document once: {summary['every_document_once']}, ask exit {answer.returncode}"
          f" -> {out}")
    subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
