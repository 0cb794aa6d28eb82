"""Held-out recovery of a translator with every gate on translated positions set to one value: is the trained
gates' optimum a real one, or flat ground?

    python benchmarks/gate_sweep.py [--checkpoint translators/smollm2__gemma.safetensors] [--values -2,-1,0,1,2]
                                    [--examples 20] [--corpus DIR] [--out docs/results/gate_sweep.json]

Each value is put on every query head of every translated layer of the checkpoint's translator (its weights as
they are; the layers it computes exactly get none), and the held-out passages are scored as the cards score them
(`evaluate_translator`: 128-token translated passage after a BOS sink, 32 continuation tokens, next text and
recall, recovery by loss and by KL to native). Value 0 is the translator without gates, and reproduces its card.
No question of an evaluation set is read: this sweeps on held-out text only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import torch

from cagkit.config import TrainSettings
from cagkit.files import atomic_write
from cagkit.models.loading import load_model
from cagkit.translate.train.heldout import evaluate_translator
from cagkit.translate.translator import Translator, TranslatorNet, read_translator


def with_gates(translator: Translator, value: float, heads: int) -> Translator:
    """`translator` with gates on `heads` query heads, every one at `value`."""
    net = TranslatorNet(dataclasses.replace(translator.cfg, gate_heads=heads))
    state = {k: v for k, v in translator.net.state_dict().items() if k != "gate"}
    net.load_state_dict({**state, "gate": torch.full((translator.cfg.target_layers, heads), value)})
    return Translator(net, translator.source_fingerprint, translator.target_fingerprint, translator.card)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="translators/smollm2__gemma.safetensors")
    parser.add_argument("--values", default="-2,-1,0,1,2", help="gate values, comma-separated")
    parser.add_argument("--examples", type=int, default=TrainSettings.heldout_examples)
    parser.add_argument("--corpus", default=os.path.join(os.environ.get("CAGKIT_DATA", "../shared/data"), "corpus"))
    parser.add_argument("--out", default="docs/results/gate_sweep.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    translator = read_translator(Path(args.checkpoint))
    source = load_model(translator.card["source"]["name"], "cpu")  # the training code's scoring runs on the CPU
    target = load_model(translator.card["target"]["name"], "cpu")
    heads = target.model.config.get_text_config().num_attention_heads
    settings = TrainSettings(heldout_examples=args.examples)
    rows = []
    print(f"{'gate':>6}  next (loss / KL recovery)  recall (loss / KL recovery)")
    for value in (float(v) for v in args.values.split(",")):
        scores = evaluate_translator(with_gates(translator, value, heads), source, target, Path(args.corpus),
                                     settings)
        row = {"gate": value,
               "next": {"recovery": scores["recovery"]["translated"],
                        "kl_recovery": scores["kl_recovery"]["translated"]},
               "recall": {"recovery": scores["recall"]["recovery"]["translated"],
                          "kl_recovery": scores["recall"]["kl_recovery"]["translated"]}}
        rows.append(row)
        print(f"{value:>6g}  {row['next']['recovery']:.3f} / {row['next']['kl_recovery']:.3f}"
              f"              {row['recall']['recovery']:.3f} / {row['recall']['kl_recovery']:.3f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out) as tmp:
        tmp.write_text(json.dumps({"checkpoint": args.checkpoint, "examples": args.examples, "rows": rows,
                                   "command": "python benchmarks/gate_sweep.py --checkpoint " + args.checkpoint
                                   + " --values " + args.values}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
