"""`place_chunks` against the plain way it replaced (join the chunks, rotate each layer's keys with `apply_rope`,
hand both to the cache's `update`, which joins them to the prefix again), in the same run, alternating, on random
RoPE-free KV in a target's shapes; both must give the same cache to the bit. No weights are loaded.

    python benchmarks/place_chunks.py --model qwen-1.5b [--tokens 4096] [--chunks 24] [--repeats 7] [--threads 1]
        [--out results/place-chunks-qwen-1.5b.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from cagkit.bench import write_results
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.rope import RotaryTables, apply_rope

sys.path.insert(0, str(Path(__file__).parent))
from load_place import PREFIX_TOKENS, common_options, shape_only_target  # noqa: E402


@torch.no_grad()
def plain(model, cache: DynamicCache, chunks: list[ChunkKV], tables: RotaryTables) -> None:
    start = cache.get_seq_length()
    keys = torch.cat([c.keys for c in chunks], dim=1)
    values = torch.cat([c.values for c in chunks], dim=1)
    positions = torch.arange(start, start + keys.shape[1])
    angles: dict = {}
    for layer in range(keys.shape[0]):
        kind = tables.kind(layer)
        if kind not in angles:
            angles[kind] = tables(layer, positions)
        k = apply_rope(keys[layer].float(), *angles[kind])
        cache.update(k.transpose(0, 1)[None], values[layer].transpose(0, 1)[None], layer)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--chunks", type=int, default=24)
    common_options(ap, repeats=7)
    args = ap.parse_args()
    model, config, tables, heads, dim = shape_only_target(args)
    layers = config.num_hidden_layers
    g = torch.Generator().manual_seed(0)
    sizes = [args.tokens // args.chunks] * (args.chunks - 1)
    sizes.append(args.tokens - sum(sizes))
    chunks = [ChunkKV(torch.randn(layers, n, heads, dim, generator=g), torch.randn(layers, n, heads, dim, generator=g))
              for n in sizes]
    prefix = [(torch.randn(1, heads, PREFIX_TOKENS, dim, generator=g), torch.randn(1, heads, PREFIX_TOKENS, dim, generator=g))
              for _ in range(layers)]

    def fresh() -> DynamicCache:
        cache = DynamicCache(config=config)
        for layer, (k, v) in enumerate(prefix):
            cache.update(k.clone(), v.clone(), layer)
        return cache

    ways = {"plain": plain, "place_chunks": place_chunks}
    times: dict[str, list[float]] = {name: [] for name in ways}
    caches = {}
    for round_ in range(args.repeats + 1):
        for name, way in ways.items():
            cache = fresh()
            started = time.perf_counter()
            way(model, cache, chunks, tables)
            elapsed = time.perf_counter() - started
            if round_:
                times[name].append(elapsed * 1e3)
            else:
                caches[name] = cache
    same = all(torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
               for a, b in zip(caches["plain"].layers, caches["place_chunks"].layers))
    medians = {name: round(statistics.median(t), 1) for name, t in times.items()}
    result = {"benchmark": "place_chunks", "model": args.model, "tokens": args.tokens, "chunks": args.chunks,
              "prefix_tokens": PREFIX_TOKENS, "repeats": args.repeats, "threads": torch.get_num_threads(),
              "same_cache": same, "ms": {k: [round(x, 1) for x in v] for k, v in times.items()},
              "ms_median": medians, "ratio": round(medians["place_chunks"] / medians["plain"], 3)}
    print(f"{args.tokens} tokens in {args.chunks} chunks, {args.model}'s shapes: plain {medians['plain']} ms, "
          f"place_chunks {medians['place_chunks']} ms ({result['ratio']}x), the same cache: {same}", flush=True)
    if args.out:
        write_results(Path(args.out), result)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
