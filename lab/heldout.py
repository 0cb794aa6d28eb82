"""Diagnostic contexts for the held-out scoring: which part of a translated chunk loses the context.

Each function returns the `variants` argument of `cagkit.translate.train.heldout.evaluate_translator`, which then
scores the contexts it builds beside none, native and translated, on the translator cards' passages.
"""

from __future__ import annotations

from cagkit.kv.chunk import ChunkKV
from cagkit.kv.prefill import sink_ids
from cagkit.kv.repair import blend
from cagkit.kv.rope import RotaryTables
from cagkit.models.loading import LoadedModel
from cagkit.translate.train.heldout import Variants, with_native_layers


def diagnostics(target: LoadedModel, swap_halves: bool = False,
                native_layer_sets: dict[str, tuple[int, ...]] | None = None,
                repair_ratios: tuple[float, ...] = ()) -> Variants:
    """The contexts to score beside the translated chunk:

    - `swap_halves`: the translated chunk with native keys (`native_keys`) and with native values
      (`native_values`): which half loses the context;
    - `native_layer_sets` (name -> layer indices): under each name, the translated chunk with those layers' keys
      and values taken from the native prefill: which layers lose the context;
    - `repair_ratios`: the translated chunk after the cross-chunk repair (`cagkit.kv.repair.blend`, tokens chosen
      by their layer-1 deviation, as `--blend-select deviation` does at ask time) has recomputed that share of its
      tokens (`repaired_R`; 1 is a full prefill by the target).
    """
    sink = sink_ids(target)
    tables = RotaryTables(target.model)

    def variants(translated: ChunkKV, native: ChunkKV, ids: list[int]) -> dict[str, list[ChunkKV]]:
        contexts = {}
        if swap_halves:
            contexts["native_keys"] = [ChunkKV(native.keys, translated.values.to(native.values.dtype))]
            contexts["native_values"] = [ChunkKV(translated.keys.to(native.keys.dtype), native.values)]
        for name, layers in (native_layer_sets or {}).items():
            contexts[name] = [with_native_layers(translated, native, layers)]
        for ratio in repair_ratios:
            contexts[f"repaired_{ratio:g}"] = blend(target.model, sink, [translated], [ids], ratio, tables)
        return contexts

    return variants
