"""Does the Mixture-of-Translators use its token-level router? Held-out recovery of a MoT checkpoint with the
router's own choices and with three ablations, plus how the router spreads the tokens over the experts.

    python benchmarks/routing.py [--checkpoint FILE] [--source smollm2] [--target gemma] [--examples 20]
                                 [--variants routed,shuffled,uniform,skip] [--corpus DIR] [--out results/routing.json]

The variants are `lab.routing`'s: `routed` (the checkpoint as trained; reproduces its card's held-out scores),
`shuffled` (each token gets another token's experts and gates: if this scores what `routed` scores, the router's
per-token choice carries nothing), `uniform` (the average expert) and `skip` (the linear path alone).

The passages, continuations and scoring are the translator cards' (`evaluate_translator` of
`cagkit.translate.train.heldout`: 128-token passages of the held-out corpus files, 32 continuation tokens; recovery
= share of the no-context -> native gap closed, by next-token loss and by KL to the native distribution).
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
from lab.routing import VARIANTS, routing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=None, help="a MoT checkpoint (default: the shipped one of the pair)")
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="gemma")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--examples", type=int, default=TrainSettings.heldout_examples)
    parser.add_argument("--corpus", default=os.path.join(os.environ.get("CAGKIT_DATA", "../shared/data"), "corpus"))
    parser.add_argument("--out", default="results/routing.json")
    args = parser.parse_args()
    if unknown := set(args.variants.split(",")) - set(VARIANTS):
        parser.error(f"unknown variant {sorted(unknown)[0]!r}; use any of {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    checkpoint = Path(args.checkpoint) if args.checkpoint else translator_path(args.source, args.target, "mot")
    translator = read_translator(checkpoint)
    if translator.kind != "mot" or translator.cfg.num_experts < 2:
        raise SystemExit(f"{checkpoint} is a {translator.kind} translator with no router; give a MoT checkpoint")
    source, target = load_model(args.source, "cpu"), load_model(args.target, "cpu")  # training code: CPU only
    settings = TrainSettings(heldout_examples=args.examples)
    results: dict = {"checkpoint": str(checkpoint), "examples": args.examples, "variants": {}}
    for variant in args.variants.split(","):
        usage: dict = {}
        with routing(variant, usage=usage if variant == "routed" else None):
            scores = evaluate_translator(translator, source, target, Path(args.corpus), settings)
        row = {task: {"loss": part["recovery"]["translated"], "kl": part["kl_recovery"]["translated"]}
               for task, part in (("next", scores), ("recall", scores["recall"]))}
        results["variants"][variant] = row
        print(f"{variant}: next {row['next']['loss']:.3f} / {row['next']['kl']:.3f}, "
              f"recall {row['recall']['loss']:.3f} / {row['recall']['kl']:.3f} (loss / KL recovery)", flush=True)
        if usage:
            layers = [usage[id(layer)] for layer in translator.net.layers if id(layer) in usage]
            results["router"] = [{"share": (r["assignments"] / r["assignments"].sum()).tolist(),
                                  "entropy": r["entropy"] / r["rows"]} for r in layers]
            busiest = max(max(r["share"]) for r in results["router"])
            entropy = sum(r["entropy"] for r in results["router"]) / len(results["router"])
            print(f"router: mean entropy {entropy:.2f} of the uniform's, the busiest expert of any layer takes "
                  f"{busiest:.0%} of its assignments", flush=True)
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
