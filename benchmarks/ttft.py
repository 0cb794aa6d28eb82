"""Long-context CAG: time to first token and quality as the context grows, the target prefilling the text (native)
against cagkit's stored cache (reused by the source model, MoT-translated for the others).

    python benchmarks/ttft.py [--sizes 512,1024,2048,4096,8192] [--targets smollm2,gemma,qwen] [--repeats 3]
        [--out results/ttft.json] [--continuation-tokens 64] [--points 3] [--no-quality]
        [--plot docs/plots/long_context.png] [--replot] [--blend R --no-quality]

The context is the first N source tokens of a held-out Gutenberg book from the shared data (`$CAGKIT_DATA`,
default `../shared/data`), ingested once with the source model: whole stored chunks are taken in order until they
hold N source tokens.

TTFT: the median of `--repeats` warm runs (after one dropped warm-up) of `answer_from_chunks` with one new token,
so it times retrieval-free TTFT: load + translate + prefill of the prompt with a fixed question. (Until commit
00dbf4b `generate` ran the LM head over every prompt position, which inflated native TTFT, for Gemma's 262k
vocabulary 1.7-2.9x; it now keeps the last position's logits only.)

Quality (unless `--no-quality`): the target's mean next-token NLL on the book's own text right after the context,
plain text with no question. The prompt is the target-native prefix exactly as `build_context_cache` builds it
(chat header up to "Context:\\n" for instruct models, BOS + "Context:\\n" for the base model), then the context,
then the continuation tokens directly. Three ways to get the context:

- `native`: the target prefills prefix + the context text itself (chunks joined by "\\n\\n", as native mode does);
- `cagkit`: the prefix is prefilled and the chunks' stored KV is placed after it (`prefix_cache` + `place_chunks`,
  as `build_context_cache` does): reused as stored for the source model, translated with `mot` otherwise;
- `none`: the prefix only.

The token stream is each chunk tokenised by the target alone, "\\n\\n" between chunks, so all three methods score
identical token ids; the native context also holds the "\n\n" between chunks, the placed one does not (as in
`cagkit ask`). `--points` continuation points are taken at the end of the context, `--continuation-tokens`
apart: the first right after the last context chunk (its continuation starts with "\\n\\n" and the next chunk),
the others cut the last chunk(s) short by C, 2C, ... tokens (a chunk's KV is causal and the translator works token
by token, so a cut chunk's KV is the chunk's KV truncated). The points share one stretch of text, so they
average out token noise, not the choice of passage. Per point the C + 1 tokens after the cut are fed after
the context and the C predictions of tokens 2..C+1 are scored, as the translator cards' held-out evaluation does
(`cagkit.translate.train.heldout.continuation_logp`). Reported per method: NLL (mean over points), recovery =
(nll_none - nll) / (nll_none - nll_native), and the mean KL(native || method) of the next-token distributions
over the full vocabulary, and for cagkit kl_recovery = 1 - KL(cagkit) / KL(none). Native needs one decoder pass
over prefix + context + continuations per size (timed as `native_decoder_ms`).

`--blend R` times cagkit with cross-chunk repair (`cagkit ask --blend R`: R of the context tokens recomputed over
every chunk; `--blend-select question` picks the sentences closest to the question); its quality is not measured
here (use `cagkit eval --blend R`), so it needs `--no-quality`.

Results go to `--out` (rewritten after every measurement, so a stopped run keeps what it measured): "rows" (TTFT,
one per target, size and mode) and "quality" (one per target and size, with the per-point values). `--plot`
draws TTFT and quality (NLL and KL recovery) against context size. `--replot` redraws the plot and prints the
tables from an existing `--out` file without running any model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from cagkit.ask import answer_from_chunks
from cagkit.config import BLEND_SELECT, Placement
from cagkit.errors import CagkitError
from cagkit.generation import prompt_parts
from cagkit.bench import command_line, write_results
from cagkit.ingest.pipeline import ingest
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefix_cache
from cagkit.kv.rope import RotaryTables
from cagkit.models.loading import load_model
from cagkit.store.store import Hit, Store
from cagkit.translate.train.data import target_logits
from cagkit.translate.train.heldout import continuation_logp, kl_from_native, nll
from lab.long_context import (
    context_chunk_count,
    continuation_points,
    join_chunks,
    recovery,
    summary_rows,
    truncated_lengths,
)

QUESTION = "Who is the main character of this story?"
SEPARATOR = "\n\n"  # what native mode puts between chunks (build_context_cache)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="512,1024,2048,4096,8192")
    parser.add_argument("--targets", default="smollm2,gemma,qwen")
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--book", default="corpus/gutenberg/testing/chesterton-brown.txt")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/ttft.json")
    parser.add_argument("--continuation-tokens", type=int, default=64, help="scored tokens per continuation point")
    parser.add_argument("--points", type=int, default=3, help="continuation points per context size")
    parser.add_argument("--no-quality", action="store_true", help="time only, as before")
    parser.add_argument("--plot", default="docs/plots/long_context.png", help="'' for no plot")
    parser.add_argument("--replot", action="store_true", help="only redraw --plot from --out")
    parser.add_argument("--blend", type=float, default=0.0, help="cagkit with cross-chunk repair (needs --no-quality)")
    parser.add_argument("--blend-select", default="deviation", choices=BLEND_SELECT,
                        help="which tokens --blend recomputes (cagkit ask --blend-select)")
    args = parser.parse_args()
    if args.blend and not args.no_quality:
        parser.error("--blend times cagkit only; add --no-quality (measure its quality with cagkit eval --blend)")
    placement = Placement(blend=args.blend, blend_select=args.blend_select)

    out = Path(args.out)
    if args.replot:
        result = json.loads(out.read_text())
        plot(result, Path(args.plot))
        _print_tables(result)
        return 0
    started = time.time()
    data = Path(os.environ.get("CAGKIT_DATA", "../shared/data"))
    store_dir = Path("results/stores/ttft") / args.source
    # Only the opening of the book is needed: about 5 characters per token covers the largest size, plus a margin
    # for the chunk after the context, which the quality continuation reads.
    excerpt = Path("results/ttft-context") / Path(args.book).name
    excerpt.parent.mkdir(parents=True, exist_ok=True)
    excerpt.write_text((data / args.book).read_text(encoding="utf-8")[: 5 * (max(_sizes(args)) + 512)])
    ingest([excerpt], store=store_dir, source=args.source, progress=False)
    rows, quality = [], []
    meta = {"source": args.source, "book": args.book, "threads": torch.get_num_threads(), "question": QUESTION,
            "continuation_tokens": args.continuation_tokens, "points": args.points, **placement.settings(),
            "command": command_line(), "started_at": time.strftime("%Y-%m-%d %H:%M")}
    result = {"settings": meta, "rows": rows, "quality": quality}

    def save(done: bool = False) -> None:  # after every measurement, so a stopped run keeps what it measured
        meta["complete"] = done
        meta["wall_s"] = round(time.time() - started, 1)
        write_results(out, result)

    with Store.open(store_dir) as store:
        chunks = [store.load_chunk(i) for i in store.chunk_ids(str(excerpt.resolve()))]
        for target in args.targets.split(","):
            lm = load_model(target)
            stream = None
            for size in _sizes(args):
                count = context_chunk_count([len(c.token_ids) for c in chunks], size)
                hits = [Hit(c.chunk_id, c.doc_path, c.idx, c.text, 1.0) for c in chunks[:count]]
                for mode in ("native", "mot"):
                    rows.append(_measure(lm, store, hits, mode, size, args.repeats, placement))
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                    save()
                if args.no_quality:
                    continue
                if stream is None:  # every chunk any size needs, in the target's space, once per target
                    last = context_chunk_count([len(c.token_ids) for c in chunks], max(_sizes(args))) + 1
                    stream = TargetStream(lm, store, chunks[:last])
                quality.append(_quality(lm, stream, count, size, args.continuation_tokens, args.points))
                print(json.dumps(quality[-1]), file=sys.stderr, flush=True)
                save()
    meta["finished_at"] = time.strftime("%Y-%m-%d %H:%M")
    save(done=True)
    if args.plot:
        plot(result, Path(args.plot))
    _print_tables(result)
    return 0


def _sizes(args) -> list[int]:
    return [int(s) for s in args.sizes.split(",")]


def _measure(lm, store, hits, mode, size, repeats, placement: Placement = Placement()) -> dict:
    runs = []
    used = mode
    for _ in range(repeats + 1):  # the first run warms up and is dropped
        try:
            answer = answer_from_chunks(lm, store, hits, QUESTION, mode, max_new_tokens=1, placement=placement)
        except CagkitError as exc:
            return {"target": lm.name, "mode": mode, "context_tokens": size, "error": str(exc)}
        runs.append(answer.timings)
        used = answer.mode
    runs = runs[1:]
    return {
        "target": lm.name,
        "mode": used,
        **({} if mode == "native" else placement.settings()),
        "size": size,
        "context_tokens": answer.context_tokens,
        "ttft_ms": statistics.median(r["ttft_ms"] for r in runs),
        "translate_ms": statistics.median(r["translate_ms"] for r in runs),
        "prefill_ms": statistics.median(r["prefill_ms"] for r in runs),
        "load_ms": statistics.median(r["load_ms"] for r in runs),
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
    }


# ---- quality -------------------------------------------------------------------------------------------------


class TargetStream:
    """The stored chunks in the target's space: per chunk its KV ([L, T, H, D], RoPE-free) and target token ids,
    and the token stream `ids` = chunk ids joined by the target's "\\n\\n" ids, with each chunk's start in it."""

    def __init__(self, lm, store: Store, chunks) -> None:
        started = time.perf_counter()
        if lm.fingerprint == store.settings.source_fingerprint:  # the source model reads its own cache
            self.mode = "reuse"
            self.kvs = [c.kv for c in chunks]
            chunk_ids = [list(c.token_ids) for c in chunks]
        else:
            from cagkit.translate.translator import load_translator

            self.mode = "mot"
            translator = load_translator(store.settings.source, store.settings.source_fingerprint, lm, kind="mot")
            pairs = translator.translate_many([(c.kv, c.token_ids, c.offsets, c.text) for c in chunks], lm)
            self.kvs = [kv for kv, _ in pairs]
            chunk_ids = [ids for _, ids in pairs]
        self.translate_s = time.perf_counter() - started
        sep = lm.tokenizer(SEPARATOR, add_special_tokens=False)["input_ids"]
        self.ids, self.starts = join_chunks(chunk_ids, sep)
        self.lengths = [len(ids) for ids in chunk_ids]
        assert all(kv.num_tokens == n for kv, n in zip(self.kvs, self.lengths))

    def context_kv(self, cut: int) -> list[ChunkKV]:
        """The placed context before stream position `cut`: every chunk starting before it, the last one cut short."""
        return [ChunkKV(kv.keys[:, :n], kv.values[:, :n])
                for kv, n in zip(self.kvs, truncated_lengths(self.starts, self.lengths, cut)) if n > 0]


@torch.no_grad()
def _quality(lm, stream: TargetStream, count: int, size: int, span: int, points: int) -> dict:
    """NLL, recovery and KL-to-native of the continuations at the end of the first `count` chunks."""
    if count >= len(stream.lengths):
        return {"target": lm.name, "size": size, "error": "the excerpt has no text after the context"}
    prefix, _ = prompt_parts(lm, QUESTION)
    context_end = stream.starts[count - 1] + stream.lengths[count - 1]
    cuts = continuation_points(context_end, span, points)
    need = context_end + span + 1
    if len(stream.ids) < need:
        return {"target": lm.name, "size": size, "error": "the chunk after the context is too short"}
    tables = RotaryTables(lm.model)
    # Native: one pass over prefix + stream; the hidden state at position len(prefix) + q - 1 predicts stream[q].
    started = time.perf_counter()
    hidden = lm.model.get_decoder()(input_ids=torch.tensor([prefix + stream.ids[: need - 1]]),
                                    use_cache=False).last_hidden_state[0]
    native_decoder_ms = (time.perf_counter() - started) * 1e3
    per_point = []
    for cut in cuts:
        continuation = stream.ids[cut: cut + span + 1]
        truth = continuation[1:]
        at = len(prefix) + cut
        logps = {"native": torch.log_softmax(target_logits(lm, hidden[at: at + span]).float(), dim=-1)}
        cache = prefix_cache(lm.model, prefix)
        logps["none"] = continuation_logp(lm, cache, continuation)
        cache = prefix_cache(lm.model, prefix)
        placed = stream.context_kv(cut)
        place_chunks(lm.model, cache, placed, tables)
        logps["cagkit"] = continuation_logp(lm, cache, continuation)
        per_point.append({
            "cut": cut,
            "native_context_tokens": cut,
            "cagkit_context_tokens": sum(kv.num_tokens for kv in placed),
            "nll": {name: nll(logp, truth) for name, logp in logps.items()},
            "kl_to_native": {name: kl_from_native(logps["native"], logps[name]) for name in ("none", "cagkit")},
        })
    methods = ("none", "native", "cagkit")
    mean_nll = {m: statistics.fmean(p["nll"][m] for p in per_point) for m in methods}
    mean_kl = {m: statistics.fmean(p["kl_to_native"][m] for p in per_point) for m in ("none", "cagkit")}
    return {
        "target": lm.name,
        "cagkit_mode": stream.mode,
        "size": size,
        "chunks": count,
        "prefix_tokens": len(prefix),
        "native_context_tokens": context_end,
        "cagkit_context_tokens": sum(stream.lengths[:count]),
        "continuation_tokens": span,
        "points": len(per_point),
        "nll": mean_nll,
        "recovery": recovery(mean_nll["none"], mean_nll["cagkit"], mean_nll["native"]),
        "recovery_per_point": [recovery(p["nll"]["none"], p["nll"]["cagkit"], p["nll"]["native"]) for p in per_point],
        "kl_to_native": mean_kl,
        "kl_recovery": 1 - mean_kl["cagkit"] / mean_kl["none"] if mean_kl["none"] > 0 else None,
        "native_decoder_ms": native_decoder_ms,
        "per_point": per_point,
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
    }


# ---- output --------------------------------------------------------------------------------------------------


def _print_tables(result: dict) -> None:
    print("| target | mode | context tokens | TTFT ms | load ms | translate ms | prefill ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        r = {**r, "mode": r["mode"] + Placement.from_settings(r).describe()}
        if "error" in r:
            print(f"| {r['target']} | {r['mode']} | {r['context_tokens']} | error: {r['error'][:60]} | | | |")
        else:
            print(f"| {r['target']} | {r['mode']} | {r['context_tokens']} | {r['ttft_ms']:.0f} | {r['load_ms']:.0f} | "
                  f"{r['translate_ms']:.0f} | {r['prefill_ms']:.0f} |")
    for q in result.get("quality", []):
        if "error" in q:
            print(f"quality {q['target']} {q['size']}: error: {q['error']}")
    if not result.get("quality"):
        return
    print()
    print("| target | size | context tokens native / cagkit | TTFT ms native / cagkit | NLL none | NLL native | "
          "NLL cagkit | recovery | KL cagkit | KL none |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in summary_rows(result):
        q, n, c = s["quality"], s["native"], s["cagkit"]
        ttft = f"{n['ttft_ms']:.0f} / {c['ttft_ms']:.0f}" if c else f"{n['ttft_ms']:.0f} / -"
        if q is None:
            print(f"| {s['target']} | {s['size']} | {n['context_tokens']} / - | {ttft} | | | | | | |")
            continue
        rec = "-" if q["recovery"] is None else f"{q['recovery']:.2f}"
        print(f"| {s['target']} ({q['cagkit_mode']}) | {s['size']} | {q['native_context_tokens']} / "
              f"{q['cagkit_context_tokens']} | {ttft} | {q['nll']['none']:.3f} | {q['nll']['native']:.3f} | "
              f"{q['nll']['cagkit']:.3f} | {rec} | {q['kl_to_native']['cagkit']:.3f} | "
              f"{q['kl_to_native']['none']:.3f} |")


def plot(result: dict, path: Path) -> None:
    """Two panels against context size, per target: TTFT, native (dashed) and cagkit (solid); and cagkit's quality
    relative to native: NLL recovery (solid) and KL recovery = 1 - KL(native || cagkit) / KL(native || none)
    (dotted), where 1 is the native context and 0 no context."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = summary_rows(result)
    targets = list(dict.fromkeys(r["target"] for r in rows))
    figure = Figure(figsize=(12, 4.6))
    left, right = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    for i, target in enumerate(targets):
        mine = sorted((r for r in rows if r["target"] == target), key=lambda r: r["size"])
        colour = f"C{i}"
        xs = [r["size"] for r in mine]
        left.plot(xs, [r["native"]["ttft_ms"] / 1e3 for r in mine], "o--", color=colour, label=f"{target} native")
        cag = [r for r in mine if r["cagkit"]]
        if cag:
            left.plot([r["size"] for r in cag], [r["cagkit"]["ttft_ms"] / 1e3 for r in cag], "o-", color=colour,
                      label=f"{target} cagkit ({cag[0]['cagkit']['mode']})")
        scored = [r for r in mine if r["quality"] and r["quality"]["recovery"] is not None]
        if scored:
            qx = [r["size"] for r in scored]
            mode = scored[0]["quality"]["cagkit_mode"]
            right.plot(qx, [r["quality"]["recovery"] for r in scored], "o-", color=colour,
                       label=f"{target} cagkit ({mode}): NLL recovery")
            right.plot(qx, [r["quality"]["kl_recovery"] for r in scored], "s:", color=colour, alpha=0.8,
                       label=f"{target} cagkit ({mode}): KL recovery")
    for axes in (left, right):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("context size (source tokens)")
        axes.grid(alpha=0.3)
    left.set_yscale("log")
    left.set_ylabel("time to first token (s)")
    left.set_title("TTFT: native prefill vs cagkit store")
    left.legend(fontsize=7, handlelength=3)
    settings = result["settings"]
    right.axhline(1.0, color="black", linestyle="--", linewidth=1, label="native (= 1)")
    right.axhline(0.0, color="gray", linestyle="-", linewidth=0.8, label="no context (= 0)")
    right.set_ylabel("recovery of the native context's effect")
    right.set_title(f"Quality: next-token NLL and KL on the continuation\n({settings.get('points', '?')} points x "
                    f"{settings.get('continuation_tokens', '?')} tokens per size)", fontsize=10)
    right.set_ylim(-0.05, 1.2)
    right.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=110, bbox_inches="tight")


if __name__ == "__main__":
    sys.exit(main())
