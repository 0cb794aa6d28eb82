"""Documents cached apart and joined, with an attention temperature on the placed context (APE's, "Adaptive
Parallel Encoding"): does sharpening or softening the question's attention to the joined documents bring its first
answer token closer to native's, which reads the documents together?

    python benchmarks/join_temperature.py --store results/stores/dev_subsampled.part-a-qwen-1.5b --model qwen-1.5b
        --data ../shared/data/eval/hotpotqa/dev_subsampled.part-a.jsonl --format hotpotqa --limit 30
        [--scales 0.95,1.05] [--threads 1] [--out docs/results/join-temperature-<model>.json]

Per question: the top-4 documents by retrieval, each cached apart after the prompt prefix (the store's own model),
joined as stored (`stored` at document scope), and native prefill of the same four read together (`native`,
whose context is the retrieved chunks; each HotpotQA paragraph is one chunk). A scale `a` multiplies the placed
context's keys in every layer after they are placed, so every later query's logits over the context are `a`
times theirs (temperature 1/a) while the prompt prefix and the question's own tokens keep theirs. Per scale: how
often the first answer token is native's, and the mean KL of native's first-token distribution to it; scale 1 is
the join as stored. APE's other part, the shared prefix before every document, is how every document is cached.
"""

from __future__ import annotations

import time

import torch

from _questions import agreement, document_questions, first_token, question_arguments
from cagkit.ask import build_context_cache
from cagkit.bench import write_results
from cagkit.config import AS_STORED
from cagkit.generation import prompt_parts
from cagkit.models.loading import load_model
from cagkit.store.store import Store


def scaled_first_token(lm, context, scale: float = 1.0, start: int = 0) -> torch.Tensor:
    """`first_token` after `context`, its placed context's keys (`start` on, as many as `context.context_tokens`)
    multiplied by `scale` first."""
    if scale != 1.0:
        for layer in context.cache.layers:
            layer.keys[:, :, start:start + context.context_tokens].mul_(scale)
    return first_token(lm, context.cache, context.pending_ids)


def main() -> None:
    ap = question_arguments(__doc__, "a store of the documents written by --model")
    ap.add_argument("--scales", default="0.95,1.05")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    scales = [1.0] + [float(s) for s in args.scales.split(",") if float(s) != 1.0]
    lm = load_model(args.model, "cpu")
    store = Store.open(args.store)
    out = args.out or f"docs/results/join-temperature-{args.model}.json"
    rows = {a: {"scale": a, "first_token_same": 0, "kl_sum": 0.0, "n": 0} for a in scales}
    results = {"settings": {"model": args.model, "store": str(args.store), "data": args.data, "limit": args.limit,
                            "top_k": 4, "threads": torch.get_num_threads()}, "rows": []}
    started = time.perf_counter()
    for n, (example, hits, placed, scope) in enumerate(document_questions(lm, store, args), 1):
        native_context = build_context_cache(lm, store, hits, example.question, "native", AS_STORED)
        native = first_token(lm, native_context.cache, native_context.pending_ids)
        prefix = len(prompt_parts(lm, example.question)[0])
        for a, row in rows.items():
            context = build_context_cache(lm, store, placed, example.question, "stored", AS_STORED, scope)
            same, kl = agreement(native, scaled_first_token(lm, context, a, prefix))
            row["n"] = n
            row["first_token_same"] += same
            row["kl_sum"] += kl
            row["kl_mean"] = row["kl_sum"] / n
        results["rows"] = [{k: v for k, v in r.items() if k != "kl_sum"} for r in rows.values()]
        write_results(out, results)
        print(f"[{n}/{args.limit}] {time.perf_counter() - started:.0f} s", flush=True)
    for r in results["rows"]:
        print(f"scale {r['scale']:.2f}  first token native's {r['first_token_same']}/{r['n']}  KL {r['kl_mean']:.4f}")


if __name__ == "__main__":
    main()
