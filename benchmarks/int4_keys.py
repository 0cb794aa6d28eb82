"""What int4 KV costs the answers, and what buys it back: a float16 store's documents read back through variants
of the store's quantization (`cagkit.kv.quant`), each against float16 on the same questions, in one process.

    python benchmarks/int4_keys.py --store results/stores/dev-v2.0.part-a-qwen --model qwen
        --data ../shared/data/eval/squad_v2/dev-v2.0.part-a.json --format squad --limit 30 [--variants ...]
        [--max-new-tokens 24] [--threads 1] [--out docs/results/int4-keys-qwen.json]

Each question is placed at document scope from the store's own model (`stored`), once as stored (float16) and once
per variant, its KV round-tripped through the variant as it is read. Per variant: how often the first answer token
is float16's, the mean KL of float16's first-token distribution to the variant's, and how often the greedy answer
(`--max-new-tokens`) is float16's word for word. `kv_fraction` is the variant's KV bytes a token over float16's,
from the model's shapes (codes, scales and minimums; not the token ids and offsets beside them in a KV file).

Variants (values int4 per token unless named; every int4 but int4-refined without the store's refined keys):
    int4               int4 as the store wrote it before its keys were refined: keys per channel, groups of 64 tokens
    int4-refined       the store's int4 now: int4, and a second 4-bit code for the keys of the
                       `quant.REFINED_KEY_LAYERS` layers it gets most wrong
    int4-keys          int4 keys, float16 values        int4-values   float16 keys, int4 values
    keys-gN            int4 keys in groups of N tokens   keys-int8     int8 keys
    refine-N           int8 keys in the N layers whose int4 keys err most (relative to their norm), chunk by chunk
    outliers-P         int4, with the P per mille of key values farthest from their group's mean kept in float16
                       (an int32 index and a float16 value each)
"""

from __future__ import annotations

import time

import torch

import cagkit.kv.chunk as chunk_module
from _questions import agreement, document_questions, first_token, question_arguments
from cagkit.ask import build_context_cache
from cagkit.bench import write_results
from cagkit.config import AS_STORED
from cagkit.generation import generate
from cagkit.kv import quant
from cagkit.kv.warm import share_cache
from cagkit.models.loading import load_model
from cagkit.store.store import Store

VARIANTS = "int4,int4-keys,int4-values,keys-g32,keys-g16,keys-int8,refine-2,refine-4,outliers-10,outliers-20"


def round_trip(keys: torch.Tensor, values: torch.Tensor, dtype: str, key_group: int = quant.KEY_GROUP,
               refined: int = 0):
    """(keys, values) float32 after the store's `dtype` quantization with keys in groups of `key_group` tokens and
    int4's keys refined in `refined` layers."""
    kept = quant.KEY_GROUP, quant.REFINED_KEY_LAYERS
    quant.KEY_GROUP, quant.REFINED_KEY_LAYERS = key_group, refined
    try:
        return quant.dequantize(quant.quantize(keys, values, dtype))
    finally:
        quant.KEY_GROUP, quant.REFINED_KEY_LAYERS = kept


def refine(keys: torch.Tensor, n: int) -> torch.Tensor:
    """int4 keys, with int8 keys in the `n` layers whose int4 keys err most relative to their norm."""
    coarse = round_trip(keys, keys, "int4")[0]
    layers = quant.most_in_error(keys, keys - coarse, n)
    coarse[layers] = round_trip(keys[layers], keys[layers], "int8")[0]
    return coarse


def outliers(keys: torch.Tensor, per_mille: int, group: int = quant.KEY_GROUP) -> torch.Tensor:
    """int4 keys with the `per_mille` of each layer's key values farthest from their group's mean kept exact
    (float16): they leave the group's range before it is quantized."""
    L, T, H, D = keys.shape
    G = -(-T // group)
    padded = torch.cat([keys, keys[:, -1:].expand(L, G * group - T, H, D)], 1) if G * group != T else keys
    grouped = padded.reshape(L, G, group, H, D)
    mean = grouped.mean(2, keepdim=True)
    far = (grouped - mean).abs().reshape(L, -1)
    n = max(1, far.shape[1] * per_mille // 1000)
    mask = (far >= far.topk(n, dim=1).values[:, -1:]).reshape(grouped.shape)
    inside = torch.where(mask, mean.expand_as(grouped), grouped).reshape(L, G * group, H, D)
    coarse = round_trip(inside, inside, "int4", group)[0]
    return torch.where(mask.reshape(L, G * group, H, D), padded.half().float(), coarse)[:, :T]


def apply(variant: str, keys: torch.Tensor, values: torch.Tensor):
    """(keys, values) float32 as `variant` stores and reads them."""
    if variant == "int4":
        return round_trip(keys, values, "int4")
    if variant == "int4-refined":
        return round_trip(keys, values, "int4", refined=quant.REFINED_KEY_LAYERS)
    int4_values = round_trip(keys, values, "int4")[1]
    if variant == "int4-keys":
        return round_trip(keys, values, "int4")[0], values
    if variant == "int4-values":
        return keys, int4_values
    if variant.startswith("keys-g"):
        return round_trip(keys, values, "int4", int(variant[6:]))[0], int4_values
    if variant == "keys-int8":
        return round_trip(keys, values, "int8")[0], int4_values
    if variant.startswith("refine-"):
        return refine(keys, int(variant[7:])), int4_values
    if variant.startswith("outliers-"):
        return outliers(keys, int(variant[9:])), int4_values
    raise SystemExit(f"unknown variant {variant}; see --help")


def kv_fraction(variant: str, layers: int, head_dim: int) -> float:
    """The variant's KV bytes a token over float16's (4 * head_dim a head and layer: keys and values, 2 bytes)."""
    D = head_dim
    vg = quant._value_group(D)

    def keys4(group=quant.KEY_GROUP):
        return D / 2 + 4 * D / group

    values4, values16, keys16 = D / 2 + 4 * D / vg, 2 * D, 2 * D
    keys8 = D + 4 * D / quant.KEY_GROUP
    size = {"int4": keys4() + values4, "int4-keys": keys4() + values16, "int4-values": keys16 + values4,
            "keys-int8": keys8 + values4}.get(variant)
    if variant.startswith("keys-g"):
        size = keys4(int(variant[6:])) + values4
    elif variant.startswith("refine-") or variant == "int4-refined":
        refined = quant.REFINED_KEY_LAYERS if variant == "int4-refined" else int(variant[7:])
        size = keys4() + values4 + min(refined, layers) / layers * D / 2
    elif variant.startswith("outliers-"):
        size = keys4() + values4 + int(variant[9:]) / 1000 * D * 6
    return size / (4 * D)


def main() -> None:
    ap = question_arguments(__doc__, "a float16 store written by --model")
    ap.add_argument("--variants", default=VARIANTS)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = args.variants.split(",")
    lm = load_model(args.model, "cpu")
    store = Store.open(args.store)
    if store.settings.dtype != "float16":
        raise SystemExit(f"--store {args.store} holds {store.settings.dtype} KV; pass a float16 store")
    real = chunk_module.ChunkKV
    current = {"variant": None}

    def read_as_variant(keys, values, *rest, **named):
        if current["variant"] and keys.ndim == 4:
            keys, values = apply(current["variant"], keys.float(), values.float())
            keys, values = keys.half(), values.half()  # as float16 would be read
        return real(keys, values, *rest, **named)

    chunk_module.ChunkKV = read_as_variant
    out = args.out or f"docs/results/int4-keys-{args.model}.json"
    rows = {v: {"variant": v, "kv_fraction": round(kv_fraction(v, lm.num_layers, lm.head_dim), 4),
                "first_token_same": 0, "kl_sum": 0.0, "same_answer": 0, "n": 0} for v in variants}
    results = {"settings": {"model": args.model, "store": str(args.store), "data": args.data,
                            "limit": args.limit, "max_new_tokens": args.max_new_tokens,
                            "threads": torch.get_num_threads(), "key_group": quant.KEY_GROUP}, "rows": []}
    started = time.perf_counter()
    for n, (example, _, placed, scope) in enumerate(document_questions(lm, store, args, 4, args.max_new_tokens), 1):
        answers, firsts = {}, {}
        for variant in [None, *variants]:
            current["variant"] = variant
            context = build_context_cache(lm, store, placed, example.question, "stored", AS_STORED, scope)
            firsts[variant] = first_token(lm, share_cache(context.cache), context.pending_ids)
            answers[variant] = generate(lm, context.cache, context.pending_ids, args.max_new_tokens).text
        for variant in variants:
            row = rows[variant]
            same, kl = agreement(firsts[None], firsts[variant])
            row["n"] = n
            row["first_token_same"] += same
            row["kl_sum"] += kl
            row["same_answer"] += int(answers[variant] == answers[None])
            row["kl_mean"] = row["kl_sum"] / n
        results["rows"] = [{k: v for k, v in r.items() if k != "kl_sum"} for r in rows.values()]
        write_results(out, results)
        print(f"[{n}/{args.limit}] {time.perf_counter() - started:.0f} s", flush=True)
    for r in results["rows"]:
        print(f"{r['variant']:>12}  {r['kv_fraction']:.3f}x  first token {r['first_token_same']}/{r['n']}  "
              f"KL {r['kl_mean']:.5f}  same answer {r['same_answer']}/{r['n']}")


if __name__ == "__main__":
    main()
