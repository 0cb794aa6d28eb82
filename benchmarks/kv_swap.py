"""Which half of a translated chunk loses the context: keys or values? Held-out next-text and recall recovery
with the translated KV, with native keys and translated values, and with translated keys and native values.

    python benchmarks/kv_swap.py [--source smollm2] [--target gemma] [--kinds mot,linear] [--examples 20]
                                 [--corpus DIR] [--out results/kv_swap.json]

The passages, continuations and scoring are the translator cards' (`evaluate_translator` of
`cagkit.translate.train.heldout` with `lab.heldout.diagnostics(swap_halves=True)`: 128-token passages of the
held-out corpus files, 32 continuation tokens, recovery = share of the no-context -> native loss gap closed), so the
"translated" column reproduces the cards' held-out scores.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from cagkit.config import TrainSettings
from cagkit.bench import write_results
from cagkit.models.loading import load_model
from cagkit.translate.train.heldout import evaluate_translator
from cagkit.translate.translator import read_translator, translator_path
from lab.heldout import diagnostics

COLUMNS = ("translated", "native_keys", "native_values")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="gemma")
    parser.add_argument("--kinds", default="mot,linear")
    parser.add_argument("--examples", type=int, default=TrainSettings.heldout_examples)
    parser.add_argument("--corpus", default=os.path.join(os.environ.get("CAGKIT_DATA", "../shared/data"), "corpus"))
    parser.add_argument("--out", default="results/kv_swap.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    source, target = load_model(args.source, "cpu"), load_model(args.target, "cpu")  # training code: CPU only
    settings = TrainSettings(heldout_examples=args.examples)
    results = {}
    for kind in args.kinds.split(","):
        translator = read_translator(translator_path(args.source, args.target, kind))
        scores = evaluate_translator(translator, source, target, Path(args.corpus), settings,
                                     variants=diagnostics(target, swap_halves=True))
        results[kind] = {"next": {c: scores["recovery"][c] for c in COLUMNS},
                         "recall": {c: scores["recall"]["recovery"][c] for c in COLUMNS}}
        for task, row in results[kind].items():
            print(f"{kind} {task}: " + ", ".join(f"{c} {row[c]:.2f}" for c in COLUMNS))
    write_results(args.out, {"source": args.source, "target": args.target, "examples": args.examples,
                             "loss_recovery": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
