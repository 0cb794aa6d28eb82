"""Does the Mixture-of-Translators use its token-level router? Held-out recovery of a MoT checkpoint with the
router's own choices and with three ablations, plus how the router spreads the tokens over the experts.

    python benchmarks/routing.py [--checkpoint FILE] [--source smollm2] [--target gemma] [--examples 20]
                                 [--variants routed,shuffled,uniform,skip] [--corpus DIR] [--out results/routing.json]

Variants (every translated layer at once; the skip path and the trunk are untouched):
- `routed`: the checkpoint as trained; reproduces its card's held-out scores.
- `shuffled`: each token gets the experts and gates the router chose for another token of the same chunk and
  layer (a fixed random permutation). Which experts are used, and how often, stays the same; what changes is
  which token gets which. If this scores what `routed` scores, the router's per-token choice carries nothing.
- `uniform`: every expert on every token, each weighted 1/E: the average expert.
- `skip`: no expert at all, only the low-rank linear path under them.

The passages, continuations and scoring are the translator cards' (`cagkit.training.evaluate_translator`:
128-token passages of the held-out corpus files, 32 continuation tokens; recovery = share of the no-context ->
native gap closed, by next-token loss and by KL to the native distribution).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from pathlib import Path

import torch

from cagkit.config import TrainSettings
from cagkit.models.loading import load_model
from cagkit.translate.train.training import evaluate_translator
from cagkit.translate.translator import LayerTranslator, read_translator, translator_path

VARIANTS = ("routed", "shuffled", "uniform", "skip")


@contextlib.contextmanager
def routing(variant: str, seed: int = 0, usage: dict | None = None):
    """Replace `LayerTranslator.route` by the ablation `variant` for the duration; with `usage`, record per layer
    (by module id) the share of assignments per expert and the router's mean entropy / log E."""
    original = LayerTranslator.route
    generator = torch.Generator().manual_seed(seed)

    def route(self, h):
        probs, top_i, gates = original(self, h)
        if usage is not None:
            record = usage.setdefault(id(self), {"assignments": torch.zeros(probs.shape[1]), "entropy": 0.0, "rows": 0})
            record["assignments"] += torch.bincount(top_i.reshape(-1), minlength=probs.shape[1]).float()
            record["entropy"] += float(-(probs * probs.clamp_min(1e-12).log()).sum()) / math.log(probs.shape[1])
            record["rows"] += probs.shape[0]
        if variant == "shuffled":
            order = torch.randperm(h.shape[0], generator=generator).to(h.device)
            return probs, top_i[order], gates[order]
        if variant == "uniform":
            every = torch.arange(probs.shape[1], device=h.device).expand(h.shape[0], -1)
            return probs, every, torch.full(every.shape, 1 / probs.shape[1], device=h.device)
        if variant == "skip":
            return probs, top_i, torch.zeros_like(gates)
        return probs, top_i, gates

    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; use any of {', '.join(VARIANTS)}")
    LayerTranslator.route = route
    try:
        yield
    finally:
        LayerTranslator.route = original


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
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
