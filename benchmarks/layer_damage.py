"""Which target layers lose the context? Held-out recovery with one translated layer at a time (every other layer
native), with one native layer at a time (every other layer translated), with a band of layers translated, and
with the bottom or top half native.

    python benchmarks/layer_damage.py [--source smollm2] [--target qwen] [--kind mot] [--sweeps damage,gain]
                                      [--bands 4] [--examples 20] [--corpus DIR]
                                      [--out results/layer_damage-SOURCE-TARGET.json]

The passages, continuations and scoring are the translator cards' (`evaluate_translator` of
`cagkit.translate.train.heldout` with `lab.heldout.diagnostics(native_layer_sets=...)`), so the "translated" row
reproduces the cards' held-out scores. A layer's *damage* is 1 minus the KL recovery of the context where only that
layer is translated: what translating that layer alone costs. Its *gain* is the KL recovery with only that layer
native minus the KL recovery with every layer translated: what a perfect translation of that layer alone would buy.
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

SWEEPS = ("damage", "gain")


def layer_sets(num_layers: int, bands: int, sweeps=SWEEPS) -> dict[str, tuple[int, ...]]:
    """Context name -> the layers taken from the native prefill."""
    every = range(num_layers)
    half = num_layers // 2
    sets = {}
    if "damage" in sweeps:
        sets.update({f"only_{layer}_translated": tuple(i for i in every if i != layer) for layer in every})
    if "gain" in sweeps:
        sets.update({f"only_{layer}_native": (layer,) for layer in every})
    edges = [round(b * num_layers / bands) for b in range(bands + 1)]
    for lo, hi in zip(edges, edges[1:]):
        sets[f"only_{lo}-{hi - 1}_translated"] = tuple(i for i in every if not lo <= i < hi)
    sets[f"native_bottom_{half}"] = tuple(range(half))
    sets[f"native_top_{num_layers - half}"] = tuple(range(half, num_layers))
    return sets


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="qwen")
    parser.add_argument("--kind", default="mot", help="which shipped checkpoint of the pair (default: mot)")
    parser.add_argument("--sweeps", default=",".join(SWEEPS),
                        help="per-layer sweeps: damage (one layer translated), gain (one layer native)")
    parser.add_argument("--bands", type=int, default=4, help="contiguous bands of layers translated one at a time")
    parser.add_argument("--examples", type=int, default=TrainSettings.heldout_examples)
    parser.add_argument("--corpus", default=os.path.join(os.environ.get("CAGKIT_DATA", "../shared/data"), "corpus"))
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sweeps = args.sweeps.split(",")
    if not sweeps or set(sweeps) - set(SWEEPS):
        parser.error(f"--sweeps {args.sweeps}: give a comma-separated list of {', '.join(SWEEPS)}")
    torch.set_num_threads(1)
    source, target = load_model(args.source, "cpu"), load_model(args.target, "cpu")  # training code: CPU only
    if not 1 <= args.bands <= target.num_layers:
        parser.error(f"--bands {args.bands}: give 1 to {target.num_layers} (the target's layers)")
    translator = read_translator(translator_path(args.source, args.target, args.kind))
    settings = TrainSettings(heldout_examples=args.examples)
    sets = layer_sets(target.num_layers, args.bands, sweeps)
    scores = evaluate_translator(translator, source, target, Path(args.corpus), settings,
                                 variants=diagnostics(target, native_layer_sets=sets))
    result = {"source": args.source, "target": args.target, "kind": args.kind, "examples": args.examples,
              "layers": target.num_layers, "tasks": {}}
    for task, block in (("next", scores), ("recall", scores["recall"])):
        result["tasks"][task] = {"loss_recovery": block["recovery"], "kl_recovery": block["kl_recovery"]}
        kl = block["kl_recovery"]
        print(f"{task}: translated {block['recovery']['translated']:.2f} / {kl['translated']:.2f} "
              f"(loss / KL recovery)")
        layers = range(target.num_layers)
        if "damage" in sweeps:
            damage = [1 - kl[f"only_{layer}_translated"] for layer in layers]
            print(f"  damage of one translated layer (1 - KL recovery), layers 0..{target.num_layers - 1}: "
                  + " ".join(f"{d:.3f}" for d in damage))
            print(f"  sum over layers {sum(damage):.3f} against {1 - kl['translated']:.3f} with all translated")
        if "gain" in sweeps:
            gain = [kl[f"only_{layer}_native"] - kl["translated"] for layer in layers]
            print(f"  gain of one native layer (KL recovery over all translated), layers 0..{target.num_layers - 1}: "
                  + " ".join(f"{g:.3f}" for g in gain))
        for name in sets:
            if not name.startswith("only_") or "-" in name:
                print(f"  {name}: {block['recovery'][name]:.2f} / {kl[name]:.2f}")
    out = Path(args.out or f"results/layer_damage-{args.source}-{args.target}.json")
    write_results(out, result)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
