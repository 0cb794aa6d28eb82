"""Injection depth: answer quality and time to first token as the target recomputes more of its bottom layers.

    python benchmarks/injection_depth.py [--target gemma] [--depths 0,2,4,9,18] [--limit 30] [--kind mot]

For each depth K the target recomputes its bottom K layers over each retrieved chunk (a partial prefill, about
K/L of a native one) and the layers above come from the translator (`cagkit eval --recompute-layers K`);
K = 0 is the translator's default (layer 0 is exact from the embeddings anyway) and K = L is the `oracle`
method (the target's own per-chunk caches). Native prefill of the same chunks is the reference. Every run is a
`cagkit eval` results file under results/depth/ (resumed if interrupted); the script then writes a table to
stdout and to results/depth/<data>-<target>.json, and a plot to docs/plots/injection_depth.png.
The data is SQuAD v2 from `$CAGKIT_DATA` (default ../shared/data) unless --data says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cagkit.evaluation.runner import run_eval
from cagkit.models import load_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_root = Path(os.environ.get("CAGKIT_DATA", "../shared/data"))
    parser.add_argument("--data", default=str(data_root / "eval/squad_v2/dev-v2.0.part-a.json"))
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="gemma")
    parser.add_argument("--kind", default="mot", choices=["mot", "projector", "linear"])
    parser.add_argument("--depths", default="0,2,4,9,18")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--plot", default="docs/plots/injection_depth.png")
    args = parser.parse_args()

    layers = load_model(args.target).num_layers
    depths = [int(d) for d in args.depths.split(",")]
    if any(not 0 <= d <= layers for d in depths):
        parser.error(f"--depths must lie between 0 and {layers} for {args.target}")
    folder = Path("results/depth")
    stem = f"{Path(args.data).stem}-{args.source}-{args.target}"
    reference = run_eval(args.data, args.source, args.target, ["native"], args.limit,
                         out=folder / f"{stem}-native.json")
    native = json.loads(reference.read_text())["methods"]["native"]
    rows = []
    for depth in depths:
        out = run_eval(args.data, args.source, args.target, [args.kind], args.limit, recompute_layers=depth,
                       out=folder / f"{stem}-{args.kind}-k{depth}.json")
        scores = json.loads(out.read_text())["methods"][args.kind]
        quality = scores.get("f1", scores.get("accuracy"))
        base = native.get("f1", native.get("accuracy"))
        rows.append({"recompute_layers": depth, "share_of_layers": depth / layers, "quality": quality,
                     "recovery": quality / base if base else None, "ttft_ms_median": scores["ttft_ms_median"],
                     "translate_ms_median": scores["translate_ms_median"], "n": scores["n"]})
    summary = {"data": args.data, "source": args.source, "target": args.target, "kind": args.kind,
               "layers": layers, "limit": args.limit, "native": {
                   "quality": native.get("f1", native.get("accuracy")), "ttft_ms_median": native["ttft_ms_median"],
                   "n": native["n"]}, "depths": rows}
    (folder / f"{stem}-{args.kind}.json").write_text(json.dumps(summary, indent=1))
    print(f"{args.target}, {args.kind}, {native['n']} questions; native quality {summary['native']['quality']:.3f}, "
          f"TTFT {native['ttft_ms_median']:.0f} ms")
    print("| recomputed layers | quality | / native | TTFT ms (median) | translate + recompute ms |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        recovery = f"{r['recovery']:.0%}" if r["recovery"] is not None else "-"
        print(f"| {r['recompute_layers']} / {layers} | {r['quality']:.3f} | {recovery} | {r['ttft_ms_median']:.0f} "
              f"| {r['translate_ms_median']:.0f} |")
    _plot(summary, Path(args.plot))
    return 0


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["depths"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    x = [r["recompute_layers"] for r in rows]
    left.plot(x, [r["quality"] for r in rows], "o-", label=f"{summary['kind']} + recomputed bottom layers")
    left.axhline(summary["native"]["quality"], color="k", ls="--", label="native prefill")
    left.set_xlabel(f"target layers recomputed (of {summary['layers']})")
    left.set_ylabel("F1" if rows and rows[0]["quality"] is not None else "quality")
    left.legend()
    right.plot(x, [r["ttft_ms_median"] for r in rows], "o-", label=summary["kind"])
    right.axhline(summary["native"]["ttft_ms_median"], color="k", ls="--", label="native prefill")
    right.set_xlabel(f"target layers recomputed (of {summary['layers']})")
    right.set_ylabel("median time to first token (ms)")
    right.legend()
    fig.suptitle(f"Injection depth, {summary['source']} -> {summary['target']}, {summary['native']['n']} questions")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
