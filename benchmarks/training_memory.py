"""Peak memory of a translator run's data loading, statistics and ridge fit: shards read on demand (as
training does) against every example held in memory (as it did before).

    python benchmarks/training_memory.py --mode stream|memory [--source smollm2] [--target gemma] [--shards 8]

Reads the paired-prefill shards a `cagkit translators train` run left in `$CAGKIT_HOME/train/SOURCE__TARGET`
(25 examples each); run each mode in its own process, since the peak is per process.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import torch

from cagkit.config import TrainSettings
from cagkit.models.loading import load_model
from cagkit.models.registry import cagkit_home
from cagkit.translate.train.data import TrainingData
from cagkit.translate.train.ridge import fit_ridge, fit_statistics
from cagkit.translate.translator import TranslatorConfig, TranslatorNet


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["stream", "memory"], required=True)
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="gemma")
    parser.add_argument("--shards", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(1)
    source, target = load_model(args.source, "cpu"), load_model(args.target, "cpu")  # training code: CPU only
    after_models = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    work = cagkit_home() / "train" / f"{args.source}__{args.target}"
    folders = sorted(work.glob("data-*"))
    if not folders:
        print(f"no training shards under {work}; run `cagkit translators train --source {args.source} --target "
              f"{args.target} --corpus DIR` first", file=sys.stderr)
        return 2
    paths = [folders[0] / f"shard_{i:04d}.pt" for i in range(args.shards)]
    data = TrainingData(paths)
    if args.mode == "memory":
        data = data.all()
    net = TranslatorNet(TranslatorConfig.for_models("mot", source, target))
    started = time.time()
    fit_statistics(net, data)
    errors = fit_ridge(net, data, TrainSettings().ridge)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.mode}, {args.shards} shards from {folders[0].name}: peak {peak:.0f} MB (models loaded: "
          f"{after_models:.0f} MB), statistics + ridge {time.time() - started:.0f} s, ridge kv mse {errors['kv']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
