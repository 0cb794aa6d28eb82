"""How much of the held-out context the cross-chunk repair gives back on top of the translation: next-text and
recall recovery (by loss and by KL to native) with the translated chunk alone and after the repair has
recomputed a share of its tokens.

    python benchmarks/heldout_repair.py [--source smollm2] [--target gemma] [--kinds mot,projector,linear]
                                        [--ratios 0.15,0.3] [--examples 20] [--corpus DIR] [--translators DIR]
                                        [--out results/heldout_repair.json]

The passages, continuations and scoring are the translator cards' (`evaluate_translator` of
`cagkit.translate.train.heldout` with `lab.heldout.diagnostics(repair_ratios=...)`: 128-token passages of the
held-out corpus files, 32 continuation tokens, recovery = share of the no-context -> native gap closed), so the
"translated" column reproduces the cards' held-out scores. A held-out passage has no question, so the repair picks
its tokens by their layer-1 deviation (`--blend-select deviation`), not by the question as `ask` does by default.
`--translators DIR` reads the checkpoints from DIR instead of the shipped ones (as CAGKIT_TRANSLATORS does for
`ask`).
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="gemma")
    parser.add_argument("--kinds", default="mot,projector,linear")
    parser.add_argument("--ratios", default="0.15,0.3", help="shares of the passage's tokens to recompute")
    parser.add_argument("--examples", type=int, default=TrainSettings.heldout_examples)
    parser.add_argument("--corpus", default=os.path.join(os.environ.get("CAGKIT_DATA", "../shared/data"), "corpus"))
    parser.add_argument("--translators", help="folder of checkpoints to score instead of the shipped ones")
    parser.add_argument("--out", default="results/heldout_repair.json")
    args = parser.parse_args()
    ratios = tuple(float(r) for r in args.ratios.split(","))
    if args.translators:
        os.environ["CAGKIT_TRANSLATORS"] = args.translators
    torch.set_num_threads(1)
    source, target = load_model(args.source, "cpu"), load_model(args.target, "cpu")  # training code: CPU only
    settings = TrainSettings(heldout_examples=args.examples)
    columns = ["translated"] + [f"repaired_{r:g}" for r in ratios]
    results = {}
    print(f"{'translator':<10} {'task':<7} " + " ".join(f"{c:>15}" for c in columns) + "   (loss / KL recovery)")
    for kind in args.kinds.split(","):
        path = translator_path(args.source, args.target, kind)
        scores = evaluate_translator(read_translator(path), source, target, Path(args.corpus), settings,
                                     variants=diagnostics(target, repair_ratios=ratios))
        results[kind] = {"checkpoint": str(path)}
        for task, part in (("next", scores), ("recall", scores["recall"])):
            results[kind][task] = {c: {"loss_recovery": part["recovery"][c], "kl_recovery": part["kl_recovery"][c]}
                                   for c in columns}
            cells = " ".join(f"{part['recovery'][c]:>7.2f} / {part['kl_recovery'][c]:<5.2f}" for c in columns)
            print(f"{kind:<10} {task:<7} {cells}", flush=True)
    write_results(args.out, {"source": args.source, "target": args.target, "examples": args.examples,
                             "ratios": ratios, "selection": "deviation", "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
