"""Which half of a translated chunk loses the context: keys or values? Held-out next-text and recall recovery
with the translated KV, with native keys and translated values, and with translated keys and native values.

    python benchmarks/kv_swap.py [--source smollm2] [--target gemma] [--kinds mot,linear] [--examples 20]
                                 [--corpus DIR] [--out results/kv_swap.json]

The passages, continuations and scoring are those of the translator cards (`cagkit.training.evaluate_translator`:
128-token passages of the held-out corpus files, 32 continuation tokens, recovery = share of the no-context ->
native loss gap closed), so the "translated" column reproduces the cards' held-out scores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path

import torch
from transformers import DynamicCache

from cagkit.ask import sink_ids
from cagkit.kvcache import ChunkKV, place_chunks, prefill_kv
from cagkit.models import load_model
from cagkit.rope import RotaryTables
from cagkit.training import TrainSettings, _continuation_logp, corpus_files, recall_continuation, sample_windows
from cagkit.translators import read_translator, translator_path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="gemma")
    parser.add_argument("--kinds", default="mot,linear")
    parser.add_argument("--examples", type=int, default=20)
    parser.add_argument("--corpus", default=os.path.join(os.environ.get("CAGKIT_DATA", "../shared/data"), "corpus"))
    parser.add_argument("--out", default="results/kv_swap.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    source, target = load_model(args.source), load_model(args.target)
    translators = {kind: read_translator(translator_path(args.source, args.target, kind))
                   for kind in args.kinds.split(",")}
    settings = TrainSettings()
    P, C = settings.prefix_tokens, settings.continuation_tokens
    windows = sample_windows(corpus_files(Path(args.corpus), heldout=True), args.examples, settings.seed + 7,
                             target, P + C)
    sink, tables, rng = sink_ids(target), RotaryTables(target.model), random.Random(settings.seed + 11)
    losses: dict[str, dict[str, float]] = {"next": {}, "recall": {}}
    with torch.no_grad():
        for window in windows:
            enc = target.tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)
            text = window[: enc["offset_mapping"][P - 1][1]]
            src = source.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            source_kv = prefill_kv(source.model, src["input_ids"])
            contexts: dict[str, list[ChunkKV]] = {"none": []}
            for kind, translator in translators.items():
                translated, ids = translator.translate(source_kv, src["input_ids"],
                                                       torch.tensor(src["offset_mapping"]), text, target)
                if "native" not in contexts:
                    full = prefill_kv(target.model, sink + ids, tables)
                    contexts["native"] = [ChunkKV(full.keys[:, len(sink):], full.values[:, len(sink):])]
                native = contexts["native"][0]
                contexts[f"{kind}"] = [translated]
                contexts[f"{kind}, native K"] = [ChunkKV(native.keys, translated.values.to(native.values.dtype))]
                contexts[f"{kind}, native V"] = [ChunkKV(translated.keys.to(native.keys.dtype), native.values)]
            continuations = {"next": enc["input_ids"][P: P + C],
                             "recall": recall_continuation(enc["input_ids"][:P], C, rng.randrange(P - C + 1))}
            for task, continuation in continuations.items():
                truth = torch.tensor(continuation[1:])[:, None]
                for name, chunks in contexts.items():
                    cache = DynamicCache(config=target.model.config)
                    if sink:
                        target.model.get_decoder()(input_ids=torch.tensor([sink]), cache=cache, use_cache=True)
                    place_chunks(target.model, cache, chunks, tables)
                    nll = float(-_continuation_logp(target, cache, continuation).gather(1, truth).mean())
                    losses[task][name] = losses[task].get(name, 0.0) + nll / len(windows)
    recovery = {task: {name: (nll["none"] - value) / (nll["none"] - nll["native"])
                       for name, value in nll.items() if name not in ("none", "native")}
                for task, nll in losses.items()}
    for task, scores in recovery.items():
        print(task + ": " + ", ".join(f"{name} {value:.2f}" for name, value in scores.items()))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"source": args.source, "target": args.target, "examples": len(windows),
                                          "nll": losses, "recovery": recovery}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
