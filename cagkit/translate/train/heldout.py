"""Held-out scoring of a translator: how much of the native context's effect a translated context keeps.

Held-out files (any `.txt` under a folder named `testing`, and files named `test.txt`) are never trained on;
`evaluate_translator` measures continuation NLL and KL to native over passages of them, for the text that follows
each passage and for a recall continuation (a span of the passage repeated). Training writes these scores into the
card; `score_translator` scores an existing checkpoint again.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import torch
from transformers import DynamicCache

from cagkit.config import TrainSettings
from cagkit.errors import TranslatorError
from cagkit.kv.chunk import ChunkKV
from cagkit.kv.place import place_chunks
from cagkit.kv.prefill import prefill_kv, sink_ids
from cagkit.kv.rope import RotaryTables
from cagkit.models.loading import LoadedModel, load_model
from cagkit.translate.cards import card_path, write_card
from cagkit.translate.train.data import corpus_files, recall_continuation, sample_windows, target_logits
from cagkit.translate.translator import Translator, read_translator

# Extra contexts to score beside none, native and translated: (translated chunk, native chunk, target token ids)
# -> {name: the chunks placed as that context}. The research harness (lab.heldout) builds its diagnostics so.
Variants = Callable[[ChunkKV, ChunkKV, list[int]], dict[str, list[ChunkKV]]]


def continuation_logp(target: LoadedModel, cache: DynamicCache, continuation: list[int]) -> torch.Tensor:
    """Log-probabilities [C - 1, V] of the target's next-token predictions over continuation[:-1] after `cache`."""
    ids = torch.tensor([continuation])
    out = target.model.get_decoder()(input_ids=ids[:, :-1], cache=cache, use_cache=True)
    return torch.log_softmax(target_logits(target, out.last_hidden_state[0]).float(), dim=-1)


def nll(logp: torch.Tensor, truth: list[int]) -> float:
    """Mean negative log-likelihood of the tokens `truth` [C] under the log-probabilities `logp` [C, V]."""
    return float(-logp.gather(1, torch.tensor(truth)[:, None]).mean())


def kl_from_native(native: torch.Tensor, other: torch.Tensor) -> float:
    """Mean over positions of KL(native || other) of the next-token distributions; both log-probabilities [C, V]."""
    return float((native.exp() * (native - other)).sum(-1).mean())


def with_native_layers(translated: ChunkKV, native: ChunkKV, layers) -> ChunkKV:
    """`translated` with the keys and values of `layers` replaced by the native prefill's."""
    keys, values = translated.keys.to(native.keys.dtype).clone(), translated.values.to(native.values.dtype).clone()
    for layer in layers:
        if not 0 <= layer < keys.shape[0]:
            raise ValueError(f"layer {layer} is outside the target's {keys.shape[0]} layers")
        keys[layer], values[layer] = native.keys[layer], native.values[layer]
    return ChunkKV(keys, values)


@torch.no_grad()
def evaluate_translator(translator: Translator, source: LoadedModel, target: LoadedModel, corpus: Path,
                        settings: TrainSettings, native_bottom: tuple[int, ...] = (),
                        variants: Variants | None = None) -> dict:
    """Held-out continuation scores with no context, native context and translated context (through the public
    `translate` path): NLL of the true tokens, recovery = (none - translated) / (none - native), and the fidelity
    to native, KL(native || context) over the full vocabulary (NLL alone can beat native by sharpening, KL
    cannot). `native_bottom` also scores hybrids whose bottom k layers come from a native prefill (the
    injection-depth trade-off the card records), with timings per chunk. `variants` also scores, under each name
    it returns, the contexts it builds from each passage's translated and native chunks."""
    P, C = settings.heldout_prefix_tokens, settings.continuation_tokens
    windows = sample_windows(corpus_files(corpus, heldout=True), settings.heldout_examples, settings.heldout_seed + 7,
                             target, P + C)
    sink = sink_ids(target)
    tables = RotaryTables(target.model)
    rng = random.Random(settings.heldout_seed + 11)
    sums: dict[str, dict[str, float]] = {"next": {}, "recall": {}}
    kl_sums: dict[str, dict[str, float]] = {"next": {}, "recall": {}}
    timing = {"translate": 0.0, "target_prefill_decoder": 0.0}
    for window in windows:
        enc = target.tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)
        prefix_text = window[: enc["offset_mapping"][P - 1][1]]
        src = source.tokenizer(prefix_text, add_special_tokens=False, return_offsets_mapping=True)
        source_kv = prefill_kv(source.model, src["input_ids"])
        started = time.time()
        translated, ids = translator.translate(source_kv, src["input_ids"], torch.tensor(src["offset_mapping"]),
                                               prefix_text, target)
        timing["translate"] += time.time() - started
        continuations = {"next": enc["input_ids"][P: P + C],
                         "recall": recall_continuation(enc["input_ids"][:P], C, rng.randrange(max(P - C, 0) + 1))}
        started = time.time()  # what a native prefill of the chunk costs: the decoder body, no LM head
        target.model.get_decoder()(input_ids=torch.tensor([sink + ids]), cache=DynamicCache(), use_cache=True)
        timing["target_prefill_decoder"] += time.time() - started
        native = prefill_kv(target.model, sink + ids, tables)
        native = ChunkKV(native.keys[:, len(sink):], native.values[:, len(sink):])
        contexts = {"none": [], "native": [native], "translated": [translated]}
        for k in native_bottom:
            contexts[f"native_bottom_{k}"] = [with_native_layers(translated, native, range(k))]
        if variants is not None:
            contexts.update(variants(translated, native, ids))
        for task, continuation in continuations.items():
            logps = {}
            for name, chunks in contexts.items():
                cache = DynamicCache(config=target.model.config)
                if sink:
                    target.model.get_decoder()(input_ids=torch.tensor([sink]), cache=cache, use_cache=True)
                place_chunks(target.model, cache, chunks, tables)
                logps[name] = continuation_logp(target, cache, continuation)  # [C - 1, V]
            for name, logp in logps.items():
                sums[task][name] = sums[task].get(name, 0.0) + nll(logp, continuation[1:])
                kl_sums[task][name] = kl_sums[task].get(name, 0.0) + kl_from_native(logps["native"], logp)
    n = len(windows)
    return {
        "heldout_files": [str(p) for p in corpus_files(corpus, heldout=True)],
        "examples": n,
        "prefix_tokens": P,
        "continuation_tokens": C,
        **_scores(sums["next"], kl_sums["next"], n),
        # The same contexts, continued by a span of themselves: how much of the target's recall survives.
        "recall": _scores(sums["recall"], kl_sums["recall"], n),
        "ms_per_chunk": {key: 1000 * value / n for key, value in timing.items()},
    }


def _scores(nll_sums: dict[str, float], kl_sums: dict[str, float], n: int) -> dict:
    """Mean NLL and KL-to-native per context, and their recoveries relative to no context."""
    nlls = {name: total / n for name, total in nll_sums.items()}
    kl = {name: total / n for name, total in kl_sums.items()}
    gain = nlls["none"] - nlls["native"]
    return {
        "nll": nlls,
        "recovery": {name: (nlls["none"] - value) / gain for name, value in nlls.items() if name != "none"},
        "kl_to_native": kl,
        "kl_recovery": {name: 1 - value / kl["none"] for name, value in kl.items() if name != "none"},
    }


def score_translator(checkpoint: Path, corpus: Path | None = None, log=print) -> dict:
    """Score an existing checkpoint on held-out text again, as training does at its end, and write the scores
    into its card (the weights are not touched). For cards scored before a score existed (recall, for
    instance) or before a scoring fix. The settings (passage sizes, seed, number of passages) come from the
    card, the corpus too unless `corpus` is given. Returns the new held-out scores."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise TranslatorError(f"translator {checkpoint} does not exist; pass a .safetensors checkpoint, "
                              f"for example translators/smollm2__gemma.safetensors")
    translator = read_translator(checkpoint)
    card = translator.card
    if not card.get("source") or not card.get("target"):
        raise TranslatorError(f"{card_path(checkpoint)} does not name the models the translator is for; "
                              f"retrain it with `cagkit translators train`")
    corpus = corpus if corpus is not None else card.get("corpus")
    if not corpus or not Path(corpus).is_dir():
        raise TranslatorError(f"corpus folder '{corpus}' of {checkpoint} does not exist; pass the corpus it was "
                              f"trained on with --corpus (its held-out files are scored)")
    known = {f.name for f in fields(TrainSettings)}
    settings = TrainSettings(**{k: v for k, v in (card.get("settings") or {}).items() if k in known})
    torch.set_num_threads(settings.threads)
    started = time.time()
    src, tgt = load_model(card["source"]["name"], device="cpu"), load_model(card["target"]["name"], device="cpu")
    for role, model, expected in (("source", src, translator.source_fingerprint),
                                  ("target", tgt, translator.target_fingerprint)):
        if model.fingerprint != expected:
            raise TranslatorError(f"{checkpoint} was trained for another {role} model than the installed "
                                  f"'{model.name}' (fingerprint {expected}, installed {model.fingerprint}); retrain "
                                  f"it with `cagkit translators train`")
    corpus = Path(corpus)
    log(f"scoring {checkpoint} on the held-out files of {corpus} ...")
    heldout = evaluate_translator(translator, src, tgt, corpus, settings, native_bottom=(2, tgt.num_layers // 2))
    card["heldout"] = heldout
    card["heldout_scored"] = {"by": "cagkit translators score", "corpus": str(corpus),
                              "date": time.strftime("%Y-%m-%d"), "wall_s": round(time.time() - started, 1)}
    write_card(checkpoint, card)
    return heldout
