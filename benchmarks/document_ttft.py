"""The first-token benchmark of issue #45, now `cagkit bench` (cagkit/evaluation/first_token.py); this keeps the
commands in docs/speed.md working with their old options and defaults:

    python benchmarks/document_ttft.py [--target qwen-1.5b] [--sizes ...] [--repeats N] [--book PATH-IN-DATA]
        [--store DIR] [--out FILE] [--plot FILE] [--threads N] [--device D] [--replot]

is `cagkit bench --model <target>` with --out docs/results/document-ttft-<target>.json, --plot
docs/plots/document_ttft_<target>.png and --store results/stores/document-ttft/<target> unless given, and --book
read under $CAGKIT_DATA (default ../shared/data).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from cagkit.cli import main as cagkit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen-1.5b")
    parser.add_argument("--sizes", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--repeats", default="3")
    parser.add_argument("--book", default=None, help="a text under $CAGKIT_DATA (default: cagkit bench's)")
    parser.add_argument("--store", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--threads", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--replot", action="store_true")
    args = parser.parse_args()
    t = args.target
    argv = ["bench", "--model", t, "--sizes", args.sizes, "--repeats", args.repeats,
            "--store", args.store or f"results/stores/document-ttft/{t}",
            "--out", args.out or f"docs/results/document-ttft-{t}.json",
            "--plot", f"docs/plots/document_ttft_{t}.png" if args.plot is None else args.plot, "--report", ""]
    if args.book:
        argv += ["--text", str(Path(os.environ.get("CAGKIT_DATA", "../shared/data")) / args.book)]
    argv += ["--threads", args.threads] if args.threads else []
    argv += ["--device", args.device] if args.device else []
    argv += ["--replot"] if args.replot else []
    return cagkit(argv)


if __name__ == "__main__":
    sys.exit(main())
