"""The repair's recomputed tokens attending with the grouped KV heads widened to one copy per query head before
each run (`repeat_kv`, as `cagkit.kv.attention.attention` did) and attended in place (`enable_gqa`, as it does
now), side by side in one process, alternating.

    python benchmarks/repair_attention.py [--model qwen-1.5b] [--tokens 512,2048] [--shares 0.1,0.3]
        [--repeats 3] [--threads 1] [--out docs/results/repair-attention-<model>.json]

The model is the real one; the context is random token ids and random RoPE-free KV of its cache shapes, so no
store is read. `cagkit.kv.repair.blend` chooses the tokens by the layer-1 deviation (CacheBlend's rule), which
scatters them into many short runs: each run attends once per layer, so a per-run copy of the keys and values
adds up. Per context size and share: the median of `--repeats` calls of `blend` each way, after one warm-up each,
and the largest difference between the two ways' repaired KV.
"""

from __future__ import annotations

import argparse
import time

import torch

import cagkit.kv.attention as attention_module
from cagkit.bench import side_by_side, write_results
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.repair import blend
from cagkit.kv.rope import RotaryTables
from cagkit.models.loading import load_model

GROUPED = attention_module.attention


def widened(q, k, v, causal=True, window=None, scale=None, backend="auto"):
    """The SDPA path as it was: each KV head copied for every query head it serves, then attended."""
    heads = q.shape[2]
    allowed = attention_module._mask(q.shape[1], k.shape[1], causal, window, q.device)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), attention_module._repeat_kv(k, heads).transpose(1, 2),
        attention_module._repeat_kv(v, heads).transpose(1, 2), attn_mask=allowed, scale=scale)
    return out.transpose(1, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen-1.5b")
    ap.add_argument("--tokens", default="512,2048", help="context tokens, comma-separated")
    ap.add_argument("--shares", default="0.1,0.3", help="shares of the context recomputed, comma-separated")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, "cpu")
    tables = RotaryTables(lm.model)
    out = args.out or f"docs/results/repair-attention-{args.model}.json"
    results = {"settings": {"model": args.model, "heads": lm.config.num_attention_heads,
                            "kv_heads": lm.num_kv_heads, "repeats": args.repeats,
                            "threads": torch.get_num_threads(), "rule": "deviation"}, "rows": []}
    torch.manual_seed(0)
    prefix = torch.randint(100, 1000, (8,)).tolist()
    for tokens in [int(t) for t in args.tokens.split(",")]:
        ids = torch.randint(100, 1000, (tokens,)).tolist()
        shape = (lm.num_layers, tokens, lm.num_kv_heads, lm.head_dim)
        placed = ChunkKV(torch.randn(shape), torch.randn(shape))
        for share in [float(s) for s in args.shares.split(",")]:

            def repair(grouped: bool) -> tuple[float, ChunkKV]:
                attention_module.attention = GROUPED if grouped else widened
                try:
                    started = time.perf_counter()
                    repaired = blend(lm.model, prefix, [placed], [ids], share, tables)[0]
                    return time.perf_counter() - started, repaired
                finally:
                    attention_module.attention = GROUPED

            timing, last = side_by_side(lambda way: repair(way == "enable_gqa"), ("repeat_kv", "enable_gqa"),
                                        args.repeats)
            median = timing["median_s"]
            difference = max(float((last["enable_gqa"].keys - last["repeat_kv"].keys).abs().max()),
                             float((last["enable_gqa"].values - last["repeat_kv"].values).abs().max()))
            row = {"context_tokens": tokens, "share": share, **timing, "max_kv_difference": difference}
            results["rows"].append(row)
            write_results(out, results, device=lm.device)
            print(f"{tokens} context tokens, {share:.0%} recomputed: repair with repeat_kv "
                  f"{median['repeat_kv']:.2f} s, with enable_gqa {median['enable_gqa']:.2f} s ({row['ratio']:.3f}x), "
                  f"KV differs by at most {difference:.2e}", flush=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
