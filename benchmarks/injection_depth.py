"""Ask-time placement sweeps: answer quality and time to first token as the target recomputes more of the context.

    python benchmarks/injection_depth.py [--target gemma] [--depths 0,2,4,9,18] [--limit 30] [--kinds mot]
    python benchmarks/injection_depth.py --blends 0,0.15,0.3,0.5,1 --kinds oracle,mot [--target gemma] [--limit 30]

Injection depth (`--depths`, the default sweep): for each depth K the target recomputes its bottom K layers over
each retrieved chunk alone (a partial prefill, about K/L of a native one) and the layers above come from the
translator (`cagkit eval --recompute-layers K`); K = 0 is the translator's default (layer 0 is exact from the
embeddings anyway) and K = L is the `oracle` method (the target's own per-chunk caches).

Cross-chunk repair (`--blends`): for each ratio R the target recomputes that share of the context tokens with
attention across all retrieved chunks, after a joint prefill of its bottom two layers (`cagkit eval --blend R`);
R = 1 is a joint prefill of the chunks. `oracle` shows what the repair does for perfectly translated chunks.

Native prefill of the same chunks is the reference. Every run is a `cagkit eval` results file under
results/depth/ or results/blend/ (resumed if interrupted; the native reference is shared, under results/depth/);
the script then writes a table to stdout and a summary JSON beside the runs, and a plot to
docs/plots/injection_depth.png or docs/plots/blend.png. The data is SQuAD v2 from `$CAGKIT_DATA` (default
../shared/data) unless --data says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from cagkit.config import AS_STORED, BLEND_SELECT
from cagkit.evaluation.runner import run_eval
from cagkit.bench import write_results
from cagkit.models.loading import load_model

SWEEPS = {  # option -> (results folder, run_eval keyword, axis label, file suffix, default plot)
    "depths": ("depth", "recompute_layers", "target layers recomputed over each chunk alone", "k",
               "docs/plots/injection_depth.png"),
    "blends": ("blend", "blend", "share of context tokens recomputed across chunks (--blend)", "b",
               "docs/plots/blend.png"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_root = Path(os.environ.get("CAGKIT_DATA", "../shared/data"))
    parser.add_argument("--data", default=str(data_root / "eval/squad_v2/dev-v2.0.part-a.json"))
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="gemma")
    parser.add_argument("--kinds", "--kind", default="mot", help="comma-separated: mot, projector, linear, oracle")
    sweep = parser.add_mutually_exclusive_group()
    sweep.add_argument("--depths", default=None, help="recomputed bottom layers (default sweep: 0,2,4,9,18)")
    sweep.add_argument("--blends", default=None, help="cross-chunk repair ratios, e.g. 0,0.15,0.3,0.5,1")
    parser.add_argument("--blend-select", default="deviation", choices=BLEND_SELECT,
                        help="with --blends: which tokens are recomputed (cagkit eval --blend-select)")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--plot", default=None, help="PNG path (default per sweep, under docs/plots/)")
    args = parser.parse_args()

    name = "blends" if args.blends is not None else "depths"
    folder_name, keyword, axis, suffix, default_plot = SWEEPS[name]
    kinds = args.kinds.split(",")
    if unknown := [k for k in kinds if k not in ("mot", "projector", "linear", "oracle")]:
        parser.error(f"unknown --kinds {', '.join(unknown)}; use mot, projector, linear or oracle")
    layers = load_model(args.target).num_layers
    if name == "depths":
        values = [int(d) for d in (args.depths or "0,2,4,9,18").split(",")]
        if any(not 0 <= d <= layers for d in values):
            parser.error(f"--depths must lie between 0 and {layers} for {args.target}")
    else:
        values = [float(b) for b in args.blends.split(",")]
        if any(not 0 <= b <= 1 for b in values):
            parser.error("--blends must lie between 0 and 1")
    stem = f"{Path(args.data).stem}-{args.source}-{args.target}"
    as_stored = AS_STORED.settings()  # what each sweep point departs from
    reference = run_eval(args.data, args.source, args.target, ["native"], args.limit,
                         out=Path("results/depth") / f"{stem}-native.json", **as_stored)
    native = json.loads(reference.read_text())["methods"]["native"]
    base = native.get("f1", native.get("accuracy"))
    folder = Path("results") / folder_name
    select = "" if args.blend_select == "deviation" else f"-{args.blend_select}"
    if name == "blends":
        as_stored["blend_select"] = args.blend_select
    rows = []
    for value in values:
        # One file per depth and kind (the layout of earlier runs); per ratio, one file holding every kind.
        files = ({k: folder / f"{stem}-{k}-{suffix}{value}.json" for k in kinds} if name == "depths"
                 else dict.fromkeys(kinds, folder / f"{stem}-{suffix}{value}{select}.json"))
        for kind in kinds:
            out = run_eval(args.data, args.source, args.target, [kind] if name == "depths" else kinds, args.limit,
                           out=files[kind], **{**as_stored, keyword: value})
            scores = json.loads(out.read_text())["methods"][kind]
            quality = scores.get("f1", scores.get("accuracy"))
            rows.append({"kind": kind, keyword: value, "quality": quality,
                         "recovery": quality / base if base else None, "ttft_ms_median": scores["ttft_ms_median"],
                         "translate_ms_median": scores["translate_ms_median"], "n": scores["n"]})
    summary = {"data": args.data, "source": args.source, "target": args.target, "sweep": keyword, "axis": axis,
               "layers": layers, "limit": args.limit, "native": {"quality": base,
                                                                  "ttft_ms_median": native["ttft_ms_median"],
                                                                  "n": native["n"]}, "rows": rows}
    summary["blend_select"] = args.blend_select if name == "blends" else None
    write_results(folder / f"{stem}-{'-'.join(kinds)}{select}.json", summary)
    print(f"{args.target}, {native['n']} questions; native quality {base:.3f}, TTFT {native['ttft_ms_median']:.0f} ms")
    print(f"| kind | {keyword.replace('_', ' ')} | quality | / native | TTFT ms (median) | translate + recompute ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        recovery = f"{r['recovery']:.0%}" if r["recovery"] is not None else "-"
        print(f"| {r['kind']} | {r[keyword]} | {r['quality']:.3f} | {recovery} | {r['ttft_ms_median']:.0f} "
              f"| {r['translate_ms_median']:.0f} |")
    _plot(summary, Path(args.plot or default_plot))
    return 0


def _plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keyword, rows = summary["sweep"], summary["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        x = [r[keyword] for r in mine]
        left.plot(x, [r["quality"] for r in mine], "o-", label=kind)
        right.plot(x, [r["ttft_ms_median"] for r in mine], "o-", label=kind)
    left.axhline(summary["native"]["quality"], color="k", ls="--", label="native prefill")
    right.axhline(summary["native"]["ttft_ms_median"], color="k", ls="--", label="native prefill")
    left.set_ylabel("F1" if rows and rows[0]["quality"] is not None else "quality")
    right.set_ylabel("median time to first token (ms)")
    for axes in (left, right):
        axes.set_xlabel(summary["axis"])
        axes.legend()
    what = "Injection depth" if keyword == "recompute_layers" else "Cross-chunk repair"
    fig.suptitle(f"{what}, {summary['source']} -> {summary['target']}, {summary['native']['n']} questions")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
