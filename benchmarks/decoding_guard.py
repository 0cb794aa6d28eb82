"""What the repetition guard (`cagkit.generation.next_token`) changes in an eval run, measured exactly.

Greedy decoding with the guard differs from plain greedy decoding only where plain greedy would have repeated an
n-gram of its own answer (`cagkit.config.NO_REPEAT_NGRAM` tokens): the guard acts at no other step. So the
answers of an eval run made without the guard that hold no repeated n-gram are exactly what the guard gives too,
and only the others need answering again. This script copies a results file of such a run, leaves out the
records whose prediction repeats an n-gram of the target's tokens (checked at one token shorter than the guard's
n-grams, so a prediction that re-tokenises slightly differently from the generated tokens is still caught), and
prints the `cagkit eval` command that answers them again into the copy, which then compares with the original
question by question (`cagkit compare ORIGINAL:METHOD COPY:METHOD`).

    python benchmarks/decoding_guard.py results/squad_v2-smollm2-gemma.json
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from cagkit.config import NO_REPEAT_NGRAM
from cagkit.models.registry import resolve


def repeats(ids: list[int], n: int) -> bool:
    """Whether some n consecutive tokens of `ids` occur twice."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return len(set(grams)) < len(grams)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="results file of a `cagkit eval` run made without the guard")
    parser.add_argument("--methods", default=None, help="methods to answer again (default: every method of the run "
                        "that generates: all but source's)")
    parser.add_argument("--out", default=None, help="the copy (default: RESULTS with -guard before .json)")
    args = parser.parse_args()

    source = Path(args.results)
    run = json.loads(source.read_text())
    out = Path(args.out) if args.out else source.with_name(source.stem + "-guard.json")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve(run["target"])[1])
    n = max(NO_REPEAT_NGRAM - 1, 1)
    methods = args.methods.split(",") if args.methods else [m for m in run["methods"] if m != "source"]
    for method in methods:
        records = run["methods"][method]["examples"]
        kept = [r for r in records
                if not repeats(tokenizer(r["prediction"], add_special_tokens=False)["input_ids"], n)]
        print(f"{method}: {len(records) - len(kept)} of {len(records)} answers repeat {n} tokens: answered again")
        run["methods"][method]["examples"] = kept
    out.write_text(json.dumps(run, indent=2))
    command = shlex.split(run["command"])
    if "--out" in command:
        command[command.index("--out") + 1] = str(out)
    else:
        command += ["--out", str(out)]
    print(f"wrote {out}; answer them again with:\n  {shlex.join(command)}")


if __name__ == "__main__":
    main()
