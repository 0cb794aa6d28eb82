"""`cagkit ask`: answer a question from the stored documents (`cagkit.ask.ask`)."""

from __future__ import annotations

import json
import sys

from cagkit.cli.options import (
    add_device_options,
    add_placement_options,
    add_retrieval_option,
    add_scope_option,
    add_store_option,
)
from cagkit.config import ASK_MODES, DEFAULT_MAX_NEW_TOKENS, DEFAULT_MODE, DEFAULT_MODEL, DEFAULT_TOP_K, Placement


def add_parser(sub) -> None:
    p = sub.add_parser("ask", help="answer a question from the stored documents")
    p.add_argument("question")
    add_store_option(p)
    p.add_argument("--model", default=DEFAULT_MODEL, help="target model (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="chunks to retrieve (default: %(default)s)")
    add_retrieval_option(p)
    p.add_argument("--mode", default=DEFAULT_MODE, choices=ASK_MODES,
                   help="auto: stored where the store holds the target's own KV, select elsewhere; stored: the "
                        "stored KV, as it is for the store's own model, translated by the Mixture-of-Translators for "
                        "another target (mot is its older name); select: the target prefills only the sentences "
                        "closest to the question (--blend of the context tokens) and reads no stored KV; native: "
                        "the target prefills the text; linear/projector: single-path baseline translators; "
                        "oracle (diagnostic): the target prefills each chunk alone, the cache a perfect translator "
                        "would give (default: %(default)s)")
    add_scope_option(p)
    add_placement_options(p)
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="longest answer in tokens (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object: answer, sources, timings, model, mode, "
                                                             "context_tokens, placement and retrieval")
    add_device_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from cagkit.ask import ask

    stream = None if args.json else (lambda piece: print(piece, end="", flush=True))
    result = ask(args.question, store=args.store, model=args.model, top_k=args.top_k, mode=args.mode,
                 max_new_tokens=args.max_new_tokens, on_text=stream, recompute_layers=args.recompute_layers,
                 blend=args.blend, blend_select=args.blend_select, device=args.device, retrieval=args.retrieval,
                 scope=args.scope)
    for skipped in result.skipped:
        if skipped["reason"] == "no_room":
            print(f"warning: left out document {skipped['document']}: it does not fit beside the others "
                  f"({skipped['error']}); lower --top-k or pass --scope chunks", file=sys.stderr, flush=True)
            continue
        why = ("its document was replaced or removed while this question was answered; ask again for its new text"
               if skipped["reason"] == "replaced" else
               f"its stored KV is damaged; run `cagkit store repair --store {args.store}`")
        what = f"chunk {skipped['chunk']} of" if "chunk" in skipped else "document"
        print(f"warning: skipped {what} {skipped['document']}: {why}", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print()
    print("\nsources:")
    for s in result.sources:
        print(f"  {s['score']:.3f}  {s['document']}  chunk {s['chunk']}")
    t = result.timings
    scope = (f"{len(result.documents)} whole document{'s' if len(result.documents) != 1 else ''}"
             if result.scope == "document" else "retrieved chunks")
    print(
        f"\n{result.model} ({result.mode}{Placement.from_settings(result.placement).describe()}), {result.context_tokens} "
        f"context tokens ({scope}) by {result.retrieval} retrieval: {_breakdown(t, result.mode)}, first token {t['ttft_ms']:.0f} ms "
        f"(model load {t['model_ms']:.0f} ms before it), {t['tokens_per_s']:.1f} tokens/s"
    )
    return 0


def _breakdown(t: dict, mode: str) -> str:
    """The steps before the first token that took time, in order: `retrieve 12 ms, load 40 ms, ...` (`select_ms`
    is `select` choosing its sentences, or `native` tokenising its text)."""
    steps = [("retrieve", t["retrieve_ms"]), ("select" if mode == "select" else "text", t["select_ms"]),
             ("load", t["load_ms"]),
             ("translate", t["translate_ms"] - t["repair_ms"]), ("repair", t["repair_ms"]), ("place", t["place_ms"]),
             ("prefill", t["prefill_ms"])]
    return ", ".join(f"{name} {ms:.0f} ms" for name, ms in steps if ms >= 0.5 or name in ("retrieve", "prefill"))
