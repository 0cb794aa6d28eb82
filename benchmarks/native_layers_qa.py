"""What would a perfect translation of a few target layers buy on the questions? `cagkit eval --methods mot` with
the keys and values of the chosen layers of every retrieved chunk replaced by the target's own prefill of that
chunk alone (a diagnostic: it costs a target prefill, which translation exists to avoid).

    python benchmarks/native_layers_qa.py --target qwen --layers 16 [--source smollm2] [--top-k 1] [--blend 0]
                                          [--limit 200] [--out results/native_layers-SOURCE-TARGET-L16.json]

The other layers stay translated by the shipped MoT, and every other setting is `cagkit eval`'s, so the results
file compares with `cagkit compare` against a plain `cagkit eval --methods mot,oracle,native` run with the same
--top-k, --blend and --limit (oracle: every layer the target's own).
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

import torch

from cagkit.evaluation.runner import run_eval
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.context import TranslatedKV
from cagkit.kv.prefill import chunk_alone_kv
from cagkit.translate.train.heldout import with_native_layers  # the held-out sweeps' layer swap

ask = importlib.import_module("cagkit.ask")  # the module; `cagkit.ask` the attribute is its function


class TranslatedWithNativeLayers(TranslatedKV):
    """The translated chunks with the keys and values of `layers` taken from the target's own prefill of each
    chunk alone."""

    def __init__(self, source: TranslatedKV, store, layers: list[int]) -> None:
        super().__init__(source.mode, store, source.own_layers)
        self.layers = layers

    def chunk_kv(self, lm, chunks):
        kvs, ids = super().chunk_kv(lm, chunks)
        if not 0 <= min(self.layers) <= max(self.layers) < lm.num_layers:
            raise SystemExit(f"--layers {','.join(map(str, self.layers))}: {lm.name} has layers 0 to "
                             f"{lm.num_layers - 1}")
        out = []
        for chunk, kv in zip(chunks, kvs, strict=True):
            own = chunk_alone_kv(lm, chunk.text)  # [L, T, H, D]
            if own.num_tokens != kv.num_tokens:
                raise SystemExit(f"the target's prefill has {own.num_tokens} tokens, the translation {kv.num_tokens}")
            out.append(with_native_layers(kv, ChunkKV(own.keys.float(), own.values.float()), self.layers))
        return out, ids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data_root = Path(os.environ.get("CAGKIT_DATA", "../shared/data"))
    parser.add_argument("--data", default=str(data_root / "eval/squad_v2/dev-v2.0.part-a.json"))
    parser.add_argument("--source", default="smollm2")
    parser.add_argument("--target", default="qwen")
    parser.add_argument("--layers", required=True, help="comma-separated target layers taken from its own prefill")
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--blend", type=float, default=0.0)
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    layers = [int(x) for x in args.layers.split(",")]
    chosen = ask.context_source

    def context_source(mode, lm, store, placement):
        source = chosen(mode, lm, store, placement)
        return TranslatedWithNativeLayers(source, store, layers) if isinstance(source, TranslatedKV) else source

    ask.context_source = context_source  # every translated context of the eval gets the native layers
    torch.set_num_threads(int(os.environ.get("CAGKIT_THREADS", "1")))
    tag = "-".join(map(str, layers))
    out = args.out or f"results/native_layers-{args.source}-{args.target}-L{tag}.json"
    run_eval(args.data, source=args.source, target=args.target, methods=["mot"], limit=args.limit, top_k=args.top_k,
             out=out, blend=args.blend, blend_select="question")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
