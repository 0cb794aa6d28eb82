"""Load and place one document's stored KV, store against store, in the same run, alternating: what a stored
answer's first token pays before the question's prefill, by the store's KV dtype (float16 and its int8 and int4
copies made by `cagkit store migrate --dtype`). No weights are loaded: placing needs only the target's rotary
tables and cache shapes, so the model is built from its config with a tiny MLP and vocabulary.

    python benchmarks/load_place.py --model qwen-1.5b --stores A,B,C [--document PATH] [--reads mmap,copy]
        [--repeats 5] [--threads 2] [--out results/load-place-qwen-1.5b.json]

Each round loads the document's chunks (`Store.load_chunks`: read, checksum, and for int8/int4 dequantize) and
places them after the prompt prefix (`place_chunks`: RoPE at their positions, into the cache's tensors), for each
store in turn; the first round warms the page cache and is left out of the medians. The placed caches are
compared with the first store's, so a copy whose KV differs beyond its dtype's rounding shows up. `--reads`
times each store's load both ways a local KV file can be read (`cagkit.store.kvfile.MEMORY_MAP`): its chunks as
views of the file memory-mapped (`mmap`, what cagkit does) or copied into new buffers (`copy`).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from cagkit.bench import write_results
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.rope import RotaryTables
from cagkit.models.registry import resolve
from cagkit.store import kvfile
from cagkit.store.store import Store

PREFIX_TOKENS = 20  # about a chat template's prompt prefix


def shape_only_model(model: str):
    """`model`'s architecture with its attention shapes and rotary embedding, random weights, a tiny MLP and vocab."""
    config = AutoConfig.from_pretrained(resolve(model)[1])
    text = config.get_text_config()
    text.intermediate_size, text.vocab_size, text.pad_token_id = 8, 64, None
    return AutoModelForCausalLM.from_config(config).eval(), text


def common_options(ap: argparse.ArgumentParser, repeats: int) -> None:
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)


def shape_only_target(args) -> tuple:
    """(model, config, rotary tables, KV heads, head dim) of `args.model` without its weights, on `args.threads`."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, config = shape_only_model(args.model)
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return model, config, RotaryTables(model), config.num_key_value_heads, dim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the target whose cache the KV is placed into (the stores' model)")
    ap.add_argument("--stores", required=True, help="comma-separated stores holding the same document")
    ap.add_argument("--document", default=None, help="its path or file name in the first store, found by content "
                    "in the others (default: the first store's first document)")
    ap.add_argument("--reads", default="mmap", help="comma-separated ways to read a local KV file, each timed for "
                    "every store: mmap (views of the file memory-mapped, cagkit's way), copy (into new buffers)")
    common_options(ap, repeats=5)
    args = ap.parse_args()
    reads = args.reads.split(",")
    if not reads or set(reads) - {"mmap", "copy"}:
        raise SystemExit(f"--reads {args.reads}: give mmap, copy or both, comma-separated")
    model, config, tables, heads, dim = shape_only_target(args)
    prefix = [(torch.randn(1, heads, PREFIX_TOKENS, dim), torch.randn(1, heads, PREFIX_TOKENS, dim))
              for _ in range(config.num_hidden_layers)]

    stores = [Store.open(s) for s in args.stores.split(",")]
    first = next((d for d in stores[0].documents() if args.document in (None, d.path, Path(d.path).name)), None)
    if first is None:
        raise SystemExit(f"{args.document}: not in {args.stores.split(',')[0]}; give the path or file name of one of its documents")
    document = first.path
    ids = []  # the same text by content in each store: a store ingested on its own may keep it under another path
    for name, store in zip(args.stores.split(","), stores):
        same = next((d for d in store.documents() if d.sha256 == first.sha256), None)
        if same is None:
            raise SystemExit(f"{name} does not hold {document} (sha256 {first.sha256[:12]}); give stores of the same text")
        ids.append(store.chunk_ids(same.path))
    rows, runs = [], []
    for s, store, i in zip(args.stores.split(","), stores, ids):
        for read in reads:
            rows.append({"store": s, "dtype": store.settings.dtype, "read": read, "chunks": len(i), "load_ms": [],
                         "place_ms": []})
            runs.append((store, i))
    reference = None
    for round_ in range(args.repeats + 1):
        for row, (store, chunk_ids) in zip(rows, runs):
            kvfile.MEMORY_MAP = row["read"] == "mmap"
            started = time.perf_counter()
            chunks = store.load_chunks(chunk_ids)
            loaded = time.perf_counter()
            cache = DynamicCache(config=config)
            for layer, (k, v) in enumerate(prefix):
                cache.update(k.clone(), v.clone(), layer)
            placed_at = time.perf_counter()
            place_chunks(model, cache, [ChunkKV(c.kv.keys, c.kv.values) for c in chunks], tables)
            done = time.perf_counter()
            if round_:
                row["load_ms"].append((loaded - started) * 1e3)
                row["place_ms"].append((done - placed_at) * 1e3)
            else:
                row["tokens"] = sum(c.kv.keys.shape[1] for c in chunks)
                keys = torch.cat([layer.keys for layer in cache.layers], dim=0)
                if reference is None:
                    reference = keys
                row["max_key_error_vs_first"] = float((keys - reference).abs().max())
                row["mean_key_error_vs_first"] = float((keys - reference).abs().mean())
    for store in stores:
        store.close()
    for row in rows:
        for part in ("load_ms", "place_ms"):
            row[part + "_median"] = round(statistics.median(row[part]), 1)
            row[part] = [round(x, 1) for x in row[part]]
        row["load_place_ms_median"] = round(statistics.median(
            [a + b for a, b in zip(row["load_ms"], row["place_ms"])]), 1)
        print(f"{row['dtype']:>8} {row['read']:>4} {row['tokens']} tokens: load {row['load_ms_median']} ms, place "
              f"{row['place_ms_median']} ms, together {row['load_place_ms_median']} ms "
              f"(max key error vs {rows[0]['dtype']} {row['max_key_error_vs_first']:.3g})", flush=True)
    if args.out:
        write_results(Path(args.out), {"benchmark": "load_place", "model": args.model, "document": document,
                                       "repeats": args.repeats, "threads": torch.get_num_threads(),
                                       "prefix_tokens": PREFIX_TOKENS, "rows": rows})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
