"""`cagkit eval`: answer every question of a data set by every method and write the results JSON.

The documents go through the same ingest path users run: each distinct document is written once to a text file
named by its content hash, next to the store, and ingested with the source model (incrementally, so a store is
reused across runs). Each question is then answered from the chunks of its own documents only, by each method:

    native     the target prefills the context text (the reference)
    none       the target with no context
    select     the target prefills only the sentences the question-selected repair would recompute (`--blend R` of
               the context tokens, whole sentences, in document order) and reads no stored KV: the control that
               every method reading stored KV must beat (needs `--blend` above 0 and `--blend-select question`)
    source     the source model answering from its own stored cache (reuse)
    linear     the target from the stored KV translated by one ridge map per layer
    projector  the same with one MLP projector per layer
    mot        the same with the Mixture-of-Translators
    mot-placed the Mixture-of-Translators' chunks placed as translated, with no blend whatever `--blend` says: what
               the translation alone gives, beside `mot` with the blend in the same run
    oracle     the target prefills each retrieved chunk alone (after its sink) and reads them placed as the
               translators' output is: the cache a perfect translator would give, i.e. the ceiling of every
               translated method on this store layout (a diagnostic; it costs a native prefill)

A method that places stored KV may name its own repair and scope: `stored+deviation@document` recomputes
`--blend` of the context (15% when not given, at any scope) chosen by `deviation` (any of `--blend-select`'s
choices), so several repairs are compared side by side, paired, in one run.

Open questions are answered greedily and scored by SQuAD exact match and token F1; closed-set questions choose
the option whose tokens have the highest mean log-likelihood after the prompt. Time to first token is measured
from after retrieval (retrieval is the same for every method) to the logits of the first answer token.

The results file (schema in `cagkit.evaluation.report`) is rewritten atomically after every question, and a run
with the same settings and output file resumes where the last one stopped.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from cagkit.ask import answer_from_chunks, build_context_cache, check_scope, choose_scope, default_blend
from cagkit.config import (
    BLEND_SELECT,
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_PREFILL,
    DEFAULT_SCOPE,
    DEFAULT_EVAL_MAX_NEW_TOKENS,
    DEFAULT_EVAL_METHODS,
    DEFAULT_MODEL,
    DEFAULT_RETRIEVAL,
    DEFAULT_SOURCE,
    DEFAULT_TOP_K,
    EVAL_METHODS,
    PLACEMENT_FIELDS,
    Placement,
)
from cagkit.errors import CagkitError
from cagkit.generation import context_room, prompt_parts
from cagkit.evaluation.datasets import Example, detect_format, load_examples
from cagkit.evaluation.metrics import exact_match, f1, mean, median
from cagkit.ingest.chunking import check_chunk_tokens
from cagkit.ingest.pipeline import ingest
from cagkit.kv.context import SelectedSentences
from cagkit.kv.quant import bytes_per_value
from cagkit.models.device import model_device, synchronize
from cagkit.models.loading import LoadedModel, load_model
from cagkit.retrieval.rank import check_retrieval
from cagkit.retrieval.search import retrieve
from cagkit.store.store import Hit, Store, check_dtype, is_store
from cagkit.translate.cards import checkpoint_digest, translator_path

TRANSLATED = ("linear", "projector", "mot", "mot-placed", "stored")  # translated when the store is another's
TARGET_NATIVE = ("native", "none", "oracle", "select")  # methods whose KV the target computes itself
RESULTS_DIR = Path("results")
# Settings that may differ between a run and the file it resumes: more questions, or another copy of the store.
_RESUMABLE_CHANGES = ("limit", "store")


def run_eval(
    data: str | Path,
    source: str = DEFAULT_SOURCE,
    target: str = DEFAULT_MODEL,
    methods: list[str] = DEFAULT_EVAL_METHODS,
    limit: int | None = None,
    top_k: int = DEFAULT_TOP_K,
    full_context: bool = False,
    out: str | Path | None = None,
    data_format: str | None = None,
    max_new_tokens: int = DEFAULT_EVAL_MAX_NEW_TOKENS,
    store: str | Path | None = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    recompute_layers: int = Placement.recompute_layers,
    blend: float = Placement.blend,
    blend_select: str = Placement.blend_select,
    device: str | None = None,
    retrieval: str = DEFAULT_RETRIEVAL,
    scope: str = DEFAULT_SCOPE,
    prefill: str = DEFAULT_PREFILL,
    dtype: str = "float16",
) -> Path:
    """Evaluate `methods` on the questions of `data` and write the results JSON; returns its path.

    Args:
        data: a data set file in one of `cagkit.evaluation.datasets.FORMATS`.
        source: the model that prefills the documents into the store.
        target: the model that answers (every method but `source`).
        methods: any of `cagkit.config.EVAL_METHODS` (native, none, select, source, stored, linear, projector,
            mot, mot-placed, oracle), each optionally with its own scope, as `native@chunks` (`scope` otherwise),
            and those that place KV with their own repair, as `stored+deviation` (the module's docstring).
        limit: the first `limit` questions only (all if None).
        top_k: chunks retrieved per question, from that question's own documents.
        full_context: give every method all chunks of the question's documents instead of retrieving.
        out: the results JSON (default `results/<data stem>-<source>-<target>.json`); resumed if it exists.
        data_format: the data format, detected if None.
        max_new_tokens: the longest generated answer, in tokens.
        store: the store to ingest into (default `results/stores/<data stem>-<source>`).
        chunk_tokens: the most source tokens per chunk, for a new store.
        recompute_layers: translated methods get the target's own bottom this many layers (`cagkit.ask`).
        blend: every method that places chunks (all but native, none and select) has this share of the context
            tokens recomputed across chunks (`cagkit.kv.repair`); 0 places them as stored. `select` prefills the
            sentences of this share of the context tokens (and is skipped, with the reason recorded, at 0). None:
            `cagkit.ask.default_blend` of the scope each question is placed at (0 for whole documents).
        blend_select: which tokens the blend recomputes (`Placement.blend_select`).
        device: where both models run (`cagkit.models.resolve_device`); recorded in the results as `device`.
            A run may be resumed on another device, but its time-to-first-token figures then mix the two.
        retrieval: how each question's chunks are ranked (`cagkit.retrieval`: hybrid, dense or lexical); no
            effect with `full_context`. Results files written before it was an option used `dense`.
        scope: what every method reads (`cagkit.ask.choose_scope`): the retrieved chunks' documents whole
            (`document`), the chunks (`chunks`), or documents where they fit (`auto`); so `native` prefills the
            text the stored methods place. Each record says the scope it was answered at. Results files written
            before it was an option read `chunks`.
        prefill: how a new store's documents are prefilled (`cagkit.ingest.ingest`).
        dtype: the KV dtype of a new store (`cagkit ingest --dtype`); another than float16 gets its own default
            store and results file, ending in -<dtype>.
        The three placement options and the retrieval are recorded in the settings, and a results file is
        resumed only by a run with the same ones.
    """
    placement = Placement(recompute_layers, Placement.blend if blend is None else blend, blend_select)
    blend_given = blend is not None
    check_scope(scope)
    methods = _check_methods(methods)
    check_retrieval(retrieval)
    if top_k < 1:
        raise CagkitError(f"--top-k must be at least 1, got {top_k}")
    if max_new_tokens < 1:
        raise CagkitError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    check_chunk_tokens(chunk_tokens)  # before the documents are written out for the store
    data_format = data_format or detect_format(data)
    examples = load_examples(data, data_format, limit)
    stem = Path(data).stem
    size = "" if chunk_tokens == DEFAULT_CHUNK_TOKENS else f"-c{chunk_tokens}"  # other chunk sizes get their own
    size += "" if dtype == "float16" else f"-{check_dtype(dtype)}"  # so do other KV dtypes
    store_path = Path(store) if store is not None else RESULTS_DIR / "stores" / f"{stem}-{_slug(source)}{size}"
    out = Path(out) if out is not None else RESULTS_DIR / f"{stem}-{_slug(source)}-{_slug(target)}{size}.json"

    doc_paths = write_documents(examples, documents_dir(store_path))
    documents = sorted({p for paths in doc_paths for p in paths})
    _log(f"ingesting {len(documents)} documents with {source} into {store_path}")
    # runs over the same data share its store: one started while another ingests waits for it
    ingest(documents, store=store_path, source=source, chunk_tokens=chunk_tokens, progress=True, device=device,
           wait=True, prefill=prefill, dtype=dtype)
    source_lm, target_lm = load_model(source, device), load_model(target, device)

    with Store.open(store_path) as st:
        settings = {"top_k": top_k, "full_context": full_context, "limit": limit, "max_new_tokens": max_new_tokens,
                    "chunk_tokens": st.settings.chunk_tokens, "store_dtype": st.settings.dtype,
                    "store": str(store_path), "retrieval": retrieval, "scope": scope}
        settings.update(placement.settings())
        if not blend_given:
            settings["blend_by_scope"] = True  # 0 at document scope for the methods that place KV
        results = {
            "dataset": str(data), "format": data_format, "source": source_lm.name, "target": target_lm.name,
            "fingerprints": {"source": source_lm.fingerprint, "target": target_lm.fingerprint},
            "settings": settings,
            "command": _command(data, data_format, source, target, methods, limit, top_k, full_context,
                                max_new_tokens, store, out, placement, chunk_tokens, retrieval, scope, blend_given,
                                prefill, dtype),
            "ttft": "from after retrieval to the first answer token's logits",
            "device": str(target_lm.device),
            "complete": False,
            "methods": {},
        }
        previous = _load_previous(out, results)
        models = {m: source_lm if _base(m) == "source" else target_lm for m in methods}
        stored_bytes = bytes_per_value(st.settings.dtype, source_lm.num_layers)
        about = {m: {"model": models[m].name,
                     "kv_bytes_per_token": models[m].kv_bytes_per_token(2) if _base(m) in TARGET_NATIVE
                     else source_lm.kv_bytes_per_token(stored_bytes)} for m in methods}
        for m in methods:  # a method that places chunks otherwise than the run's settings say records how
            own = _placement(m, placement)
            if not blend_given and (_own_scope(m) or scope) == "document" and own.blend and not _own_repair(m):
                own = replace(own, blend=default_blend(_mode(m), "document")).effective()
            # a named repair is always recorded: at document scope the run's settings alone read as stored
            if own != placement or _own_repair(m):
                about[m]["placement"] = own.settings()
            if _own_scope(m):
                about[m]["scope"] = _own_scope(m)
        errors = {m: e for m in methods if (e := _method_problem(_base(m), models[m], st, placement))}
        for m, message in errors.items():
            _log(f"{m}: skipped: {message}")
        active = [m for m in methods if m not in errors]
        for m in active:
            if digest := _translator_digest(_base(m), models[m], st):
                about[m]["translator"] = digest
                if m in previous and previous[m].get("translator") != digest:
                    _log(f"{m}: the translator changed since {out} was written; answering every question again")
                    del previous[m]
        # Methods of the earlier run that this one does not run keep their records (and are re-summarised).
        for m, entry in previous.items():
            if m not in methods and "examples" in entry:
                about[m] = {k: entry[k] for k in ("model", "kv_bytes_per_token", "translator", "placement", "scope")
                            if k in entry}
        records = {m: list(previous.get(m, {}).get("examples", [])) for m in about if m not in errors}
        # The command that reproduces the whole file: every method it holds, not only this run's.
        held = [m for m in EVAL_METHODS if m in about] + [m for m in about if m not in EVAL_METHODS]
        results["command"] = _command(data, data_format, source, target, held, limit, top_k, full_context,
                                      max_new_tokens, store, out, placement, chunk_tokens, retrieval, scope,
                                      blend_given, prefill, dtype)
        room = context_room(target_lm, *prompt_parts(target_lm, "?"), max_new_tokens)
        done = {m: {r["id"] for r in records[m]} for m in active}

        for number, (example, paths) in enumerate(zip(examples, doc_paths), start=1):
            todo = [m for m in active if example.id not in done[m]]
            if not todo:
                continue
            hits = example_hits(st, example.question, paths, top_k, full_context, retrieval)
            line = []
            for m in todo:
                placed, used, _ = choose_scope(st, [] if _base(m) == "none" else hits, _own_scope(m) or scope,
                                               room, _mode(m))
                own = _placement(m, placement)
                if not blend_given and not _own_repair(m):
                    own = replace(own, blend=default_blend(_mode(m), used)).effective() if own.blend else own
                record = evaluate_example(models[m], st, placed, example, _mode(m), max_new_tokens, own, used)
                record["scope"] = used
                records[m].append(record)
                done[m].add(example.id)
                line.append(f"{m} {_quality_text(record)} {record['ttft_ms']:.0f} ms")
            _log(f"[{number}/{len(examples)}] {example.id}: " + " | ".join(line))
            results["methods"] = _summaries(records, errors, about)
            write_json_atomic(out, results)

        results["methods"] = _summaries(records, errors, about)
        results["complete"] = not errors and all({e.id for e in examples} <= done[m] for m in active)
        write_json_atomic(out, results)
    return out


# --- documents and retrieval


def write_documents(examples: list[Example], folder: Path) -> list[list[str]]:
    """Write each distinct document once to `folder/<content hash>.txt`; per example, its documents' resolved paths.

    Files named by content hash make re-runs find the same files, so the incremental ingest skips them.
    """
    folder.mkdir(parents=True, exist_ok=True)
    per_example = []
    for example in examples:
        paths = []
        for text in example.context_documents():
            file = folder / f"{hashlib.sha256(text.encode()).hexdigest()[:32]}.txt"
            if not file.exists():
                tmp = file.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, file)
            paths.append(str(file.resolve()))
        per_example.append(list(dict.fromkeys(paths)))
    return per_example


def example_hits(store: Store, question: str, doc_paths: list[str], top_k: int, full_context: bool,
                 retrieval: str = DEFAULT_RETRIEVAL) -> list[Hit]:
    """The chunks one question is answered from: the `top_k` of its own documents best for the question under
    `retrieval`, best first, or with `full_context` all their chunks in document order."""
    if full_context:
        every = retrieve(store, question, store.num_chunks(), "dense", documents=doc_paths)
        order = {p: i for i, p in enumerate(doc_paths)}
        return sorted(every, key=lambda h: (order[h.doc_path], h.idx))
    return retrieve(store, question, top_k, retrieval, documents=doc_paths)


# --- answering and scoring one question


def evaluate_example(lm: LoadedModel, store: Store, hits: list[Hit], example: Example, mode: str,
                     max_new_tokens: int, placement: Placement = Placement(), scope: str = "chunks") -> dict:
    """One method's record for one question: its prediction, scores and timings. `scope`: whether `hits` are
    whole documents (`cagkit.ask.choose_scope`)."""
    if example.choices is not None:
        return _closed_set_record(lm, store, hits, example, mode, placement, scope)
    answer = answer_from_chunks(lm, store, hits, example.question, mode, max_new_tokens, placement=placement,
                                scope=scope)
    return {
        "id": example.id,
        "prediction": answer.answer,
        "f1": f1(answer.answer, example.answers),
        "exact_match": exact_match(answer.answer, example.answers),
        "ttft_ms": answer.timings["ttft_ms"],
        "translate_ms": answer.timings["translate_ms"],
        "repair_ms": answer.timings["repair_ms"],
        "context_tokens": answer.context_tokens,
    }


def _closed_set_record(lm: LoadedModel, store: Store, hits: list[Hit], example: Example, mode: str,
                       placement: Placement = Placement(), scope: str = "chunks") -> dict:
    started = time.perf_counter()
    context = build_context_cache(lm, store, hits, example.question, mode, placement, scope)
    scores, first_token_at = score_choices(lm, context, example.choices)
    chosen = max(range(len(scores)), key=scores.__getitem__)
    return {
        "id": example.id,
        "prediction": example.choices[chosen],
        "chosen": chosen,
        "correct": chosen == example.answer_index,
        "choice_scores": scores,
        "ttft_ms": (first_token_at - started) * 1e3,
        "translate_ms": context.translate_s * 1e3,
        "repair_ms": context.repair_s * 1e3,
        "context_tokens": context.context_tokens,
    }


@torch.no_grad()
def score_choices(lm: LoadedModel, context, choices: list[str]) -> tuple[list[float], float]:
    """Each choice's mean log-likelihood per token as the answer after the prompt, and when the first answer
    token's logits were ready (perf_counter time).

    `context` is a `cagkit.ask.ContextCache`; its pending tokens are prefilled once, then each choice is scored
    on its own copy of the cache.
    """
    model = lm.model
    device = model_device(model)
    last = model(input_ids=torch.tensor([context.pending_ids], device=device), cache=context.cache, use_cache=True,
                 logits_to_keep=1).logits[0, -1]
    synchronize(device)
    first_token_at = time.perf_counter()
    # A base prompt ends "Answer:", a chat prompt with a newline: the choice follows as it would be written.
    lead = "" if lm.tokenizer.decode(context.pending_ids[-1:])[-1:].isspace() else " "
    scores = []
    for choice in choices:
        ids = lm.tokenizer(lead + choice, add_special_tokens=False)["input_ids"]
        logits = last[None]  # [1, V]: predicts ids[0]
        if len(ids) > 1:
            cache = copy.deepcopy(context.cache)
            rest = model(input_ids=torch.tensor([ids[:-1]], device=device), cache=cache,
                         use_cache=True).logits[0]  # [T-1, V]
            logits = torch.cat([logits, rest])  # [T, V]: row t predicts ids[t]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        scores.append(float(logprobs[torch.arange(len(ids)), torch.tensor(ids, device=device)].mean()))
    return scores, first_token_at


# --- summaries


def _summaries(records: dict[str, list[dict]], errors: dict[str, str], about: dict[str, dict]) -> dict:
    """The `methods` entry of the results: each method's model, KV bytes per token and scores, or its error."""
    out = {m: {**about[m], **summarize(recs, records.get("native"))} for m, recs in records.items()}
    out.update({m: {**about[m], "error": message} for m, message in errors.items()})
    return out


def summarize(records: list[dict], native: list[dict] | None) -> dict:
    """One method's scores from its per-question records; recovery is relative to `native`'s records.

    Quality is F1 for open questions and 1/0 for closed-set ones; recovery compares the mean quality over the
    questions both methods answered, and is None without native or when native's quality is 0.
    """
    open_ = [r for r in records if "f1" in r]
    closed = [r for r in records if "correct" in r]
    summary: dict = {"n": len(records)}
    if closed:
        summary["accuracy"] = mean(float(r["correct"]) for r in closed)
    if open_:
        summary["f1"] = mean(r["f1"] for r in open_)
        summary["exact_match"] = mean(r["exact_match"] for r in open_)
    summary["recovery"] = _recovery(records, native)
    summary["ttft_ms_median"] = median(r["ttft_ms"] for r in records) if records else None
    summary["translate_ms_median"] = median(r["translate_ms"] for r in records) if records else None
    repairs = [r["repair_ms"] for r in records if "repair_ms" in r]  # records written before 2026-12-02 lack it
    summary["repair_ms_median"] = median(repairs) if repairs else None
    summary["context_tokens_mean"] = mean(r["context_tokens"] for r in records) if records else None
    summary["examples"] = records
    return summary


def _quality(record: dict) -> float:
    return float(record["correct"]) if "correct" in record else record["f1"]


def _recovery(records: list[dict], native: list[dict] | None) -> float | None:
    if not native:
        return None
    reference = {r["id"]: _quality(r) for r in native}
    shared = [r for r in records if r["id"] in reference]
    if not shared:
        return None
    base = mean(reference[r["id"]] for r in shared)
    return mean(_quality(r) for r in shared) / base if base > 0 else None


# --- settings, resume and files


def _check_methods(methods: list[str]) -> list[str]:
    methods = list(dict.fromkeys(m.strip() for m in methods if m.strip()))
    unknown = [m for m in methods if _base(m) not in EVAL_METHODS or _own_scope(m) not in (None, "document", "chunks")
               or _own_repair(m) not in (None, *BLEND_SELECT)]
    if unknown or not methods:
        raise CagkitError(f"unknown --methods {', '.join(unknown) or '(none given)'}; use any of "
                          f"{', '.join(EVAL_METHODS)}, each optionally with @document or @chunks, and those that "
                          f"place stored KV with +{' or +'.join(BLEND_SELECT)}")
    fixed = [m for m in methods if _own_repair(m) and (_base(m) in TARGET_NATIVE or _base(m) == "mot-placed")]
    if fixed:
        raise CagkitError(f"--methods {', '.join(fixed)}: only the methods that place stored KV (source, stored, "
                          f"linear, projector, mot) take a repair of their own; drop the +{_own_repair(fixed[0])}")
    return methods


def _base(method: str) -> str:
    """A method without its own repair or scope: `native@chunks` -> `native`, `stored+deviation` -> `stored`."""
    return method.split("@", 1)[0].split("+", 1)[0]


def _own_scope(method: str) -> str | None:
    """The scope a method names for itself (`native@chunks` -> `chunks`), or None: the run's."""
    return method.split("@", 1)[1] if "@" in method else None


def _own_repair(method: str) -> str | None:
    """The repair a method names for itself (`stored+deviation@document` -> `deviation`), or None: the run's."""
    head = method.split("@", 1)[0]
    return head.split("+", 1)[1] if "+" in head else None


def _mode(method: str) -> str:
    """The `answer_from_chunks` mode of a method (for a translated one, its translator's kind): the source reuses
    its own cache through the `mot` path, and `mot-placed` is `mot` with another placement."""
    method = _base(method)
    if method in ("native", "none"):
        return "native"
    return "mot" if method in ("source", "mot-placed") else method


def _placement(method: str, placement: Placement) -> Placement:
    """The placement a method answers with: the run's, except `mot-placed`, which never blends, and a method
    with its own repair (`stored+deviation`): the run's blend, or `Placement.blend` where the run's is 0."""
    if _base(method) == "mot-placed":
        return replace(placement, blend=0.0).effective()
    if select := _own_repair(method):
        return replace(placement, blend=placement.blend or Placement.blend, blend_select=select)
    return placement


def _method_problem(method: str, lm: LoadedModel, store: Store, placement: Placement) -> str | None:
    """Why a method cannot run (a translated method's translator is missing; `select` cannot choose sentences
    under `placement`), or None."""
    if method == "select":
        try:
            SelectedSentences.check(placement)
        except CagkitError as exc:
            return str(exc)
        return None
    if _base(method) not in TRANSLATED or lm.fingerprint == store.settings.source_fingerprint:
        return None
    try:
        from cagkit.translate.translator import load_translator

        load_translator(store.settings.source, store.settings.source_fingerprint, lm, kind=_kind(method))
    except (ImportError, CagkitError) as exc:
        return str(exc)
    return None


def _translator_digest(method: str, lm: LoadedModel, store: Store) -> str | None:
    """The first 16 hex digits of the sha256 of the checkpoint a translated method reads, else None."""
    if _base(method) not in TRANSLATED or lm.fingerprint == store.settings.source_fingerprint:
        return None
    return checkpoint_digest(translator_path(store.settings.source, lm.name, _kind(method)))


def _kind(method: str) -> str:
    """The translator a translated method reads: `stored` the pair's default, the MoT."""
    return "mot" if _base(method) == "stored" else _mode(method)


def _load_previous(out: Path, results: dict) -> dict:
    """The method entries of an earlier run to resume, or {} when there is none."""
    if not out.exists():
        return {}
    try:
        old = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CagkitError(f"{out} exists but is not a results file ({exc}); pass another --out or remove it") from None
    mine, theirs = _identity(results), _identity(old)
    if mine != theirs:
        changed = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        raise CagkitError(
            f"{out} holds results of a run with other settings ({', '.join(changed)} differ); "
            f"pass another --out, or remove the file to start again"
        )
    _log(f"resuming {out}")
    return old.get("methods", {})


def _identity(results: dict) -> dict:
    """What must match for a run to continue another's results file."""
    recorded = results.get("settings") or {}
    # blend_by_scope says only whether --blend was left to the scope: at chunk scope, the same placement
    settings = {k: v for k, v in recorded.items()
                if k not in _RESUMABLE_CHANGES and k not in PLACEMENT_FIELDS and k != "blend_by_scope"}
    settings["retrieval"] = None if settings.get("full_context") else settings.get("retrieval", "dense")
    settings.setdefault("scope", "chunks")  # files written before --scope placed the retrieved chunks
    keys = ("dataset", "format", "source", "target", "fingerprints")
    return {**{k: results.get(k) for k in keys}, **settings, **Placement.from_settings(recorded).effective().settings()}


def write_json_atomic(path: Path, results: dict) -> None:
    """Write `results` as JSON to `path` through a temporary file, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def documents_dir(store: Path) -> Path:
    """Where the documents' text files live: beside the store, whose entries are keyed by their paths.

    A copy of a store (`cagkit store migrate --to`) keeps the paths its documents were ingested from, so for a store
    that exists without a folder beside it, the folder its documents name is used: a run on the copy then finds them
    ingested instead of prefilling them again under new paths.
    """
    own = store.with_name(store.name + "-documents")
    if own.exists() or not is_store(store):
        return own
    with Store.open(store) as st:
        folders = {Path(doc.path).parent for doc in st.documents()}
    if len(folders) == 1 and (folder := folders.pop()).is_dir():
        return folder
    return own


def _command(data, data_format, source, target, methods, limit, top_k, full_context, max_new_tokens, store,
             out, placement: Placement = Placement(), chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
             retrieval: str = DEFAULT_RETRIEVAL, scope: str = DEFAULT_SCOPE, blend_given: bool = True,
             prefill: str = DEFAULT_PREFILL, dtype: str = "float16") -> str:
    args = ["cagkit", "eval", "--data", str(data), "--format", data_format, "--source", source, "--target", target,
            "--methods", ",".join(methods), "--top-k", str(top_k), "--max-new-tokens", str(max_new_tokens)]
    if chunk_tokens != DEFAULT_CHUNK_TOKENS:
        args += ["--chunk-tokens", str(chunk_tokens)]
    if limit is not None:
        args += ["--limit", str(limit)]
    if full_context:
        args.append("--full-context")
    elif retrieval != DEFAULT_RETRIEVAL:
        args += ["--retrieval", retrieval]
    if store is not None:
        args += ["--store", str(store)]
    if scope != DEFAULT_SCOPE:
        args += ["--scope", scope]
    if prefill != DEFAULT_PREFILL:  # how the store was written: a rerun writes (or finds) the same store
        args += ["--prefill", prefill]
    if dtype != "float16":
        args += ["--dtype", dtype]
    placed = placement.cli_args()
    if blend_given and "--blend" not in placed:
        placed += ["--blend", f"{placement.blend:g}"]
    args += placed
    return shlex.join(args + ["--out", str(out)])


def _slug(name: str) -> str:
    """A model name as a file-name part: `org/model` or a path becomes its safe last parts."""
    return re.sub(r"[^\w.-]+", "_", Path(name).name or name)


def _quality_text(record: dict) -> str:
    return ("right" if record["correct"] else "wrong") if "correct" in record else f"F1 {record['f1']:.2f}"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
