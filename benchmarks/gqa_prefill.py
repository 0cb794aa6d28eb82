"""A question's prefill over a placed context, with transformers' SDPA widening the grouped KV heads (`repeat_kv`,
its default under a mask) and with the grouped heads attended in place (`enable_gqa`, which `load_model` switches
on for the CPU: `cagkit.models.loading.cpu_gqa_attention`), side by side in one process, alternating.

    python benchmarks/gqa_prefill.py [--model qwen-1.5b] [--tokens 4096,16384] [--question-tokens 30] [--repeats 3]
        [--threads 1] [--out docs/results/gqa-prefill-<model>.json]

The model is the real one (its MLP is most of a short prefill). The context is random keys and values of the
model's cache shapes, so no store is read; each forward gets its own cache object over the same tensors (a prefill
writes new tensors and leaves the placed ones as they are). Per context size: the median of `--repeats` forwards of
`--question-tokens` tokens each way, after one warm-up each, and the largest difference between the two ways' last
logits.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from transformers import DynamicCache

from cagkit.bench import side_by_side, write_results
from cagkit.kv.warm import share_cache
from cagkit.models.loading import load_model

SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen-1.5b")
    ap.add_argument("--tokens", default="4096,16384", help="context tokens, comma-separated")
    ap.add_argument("--question-tokens", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, "cpu")
    heads, kv_heads, dim = lm.config.num_attention_heads, lm.num_kv_heads, lm.head_dim
    torch.manual_seed(0)
    question = torch.randint(100, 1000, (1, args.question_tokens))
    out = args.out or f"docs/results/gqa-prefill-{args.model}.json"
    results = {"settings": {"model": args.model, "heads": heads, "kv_heads": kv_heads, "head_dim": dim,
                            "question_tokens": args.question_tokens, "repeats": args.repeats,
                            "threads": torch.get_num_threads()}, "rows": []}
    for tokens in [int(t) for t in args.tokens.split(",")]:
        placed = DynamicCache()
        for layer in range(lm.num_layers):
            placed.update(torch.randn(1, kv_heads, tokens, dim), torch.randn(1, kv_heads, tokens, dim), layer)

        def prefill(grouped: bool) -> tuple[float, torch.Tensor]:
            os.environ[SWITCH] = "1" if grouped else "0"
            cache = share_cache(placed)
            started = time.perf_counter()
            with torch.no_grad():
                logits = lm.model(input_ids=question, cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            return time.perf_counter() - started, logits

        timing, last = side_by_side(lambda way: prefill(way == "enable_gqa"), ("repeat_kv", "enable_gqa"),
                                    args.repeats)
        median = timing["median_s"]
        row = {"context_tokens": tokens, **timing,
               "max_logit_difference": float((last["enable_gqa"] - last["repeat_kv"]).abs().max())}
        results["rows"].append(row)
        write_results(out, results, device=lm.device)
        print(f"{tokens} context tokens: {args.question_tokens}-token prefill with repeat_kv "
              f"{median['repeat_kv']:.2f} s, with enable_gqa {median['enable_gqa']:.2f} s ({row['ratio']:.3f}x), "
              f"logits differ by at most {row['max_logit_difference']:.2e}", flush=True)
    os.environ.pop(SWITCH, None)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
