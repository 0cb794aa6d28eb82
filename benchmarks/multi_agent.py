"""Heterogeneous multi-agent discussion: N agents mixing smollm2, gemma and qwen answer the questions of one
document set, either all reading one shared cagkit store or each keeping its own native cache of the documents.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/multi_agent.py --limit 40 \\
        [--data $CAGKIT_DATA/eval/race/race.jsonl] [--agents 8] \\
        [--out results/multi_agent.json] [--plot docs/plots/multi_agent.png]

`CAGKIT_DATA` defaults to `../shared/data`. The data must be closed-set (choices and a gold index); RACE (four
options, one ~300-token article per question) is the default. The whole article is the context
(`example_hits(..., full_context=True)`).

Agents. Agent i (0-based) runs model `smollm2, gemma, qwen`[i % 3], so N = 1..8 agents are
smollm2; +gemma; +qwen; +smollm2; ...

Settings.
    cagkit  the documents are ingested once, with smollm2, into one store (`cagkit.ingest.ingest` on the files
            `runner.write_documents` writes, exactly as `cagkit eval` does). smollm2 agents reuse the stored cache;
            gemma and qwen agents get it through the `mot` translator:
            `build_context_cache(lm, store, hits, question, "mot")`.
    native  every agent prefills the context text itself (`build_context_cache(..., "native")`).

Discussion protocol (per question, per setting, per N).
    Round 1: every agent scores the choices by mean log-likelihood (`runner.score_choices`) and picks the best.
    Round 2: every agent gets the question with the other N-1 agents' round-1 picks appended, sorted by letter,
             "<question>\\nOther agents chose: (B) <text>; (B) <text>; (C) <text>.", and scores the choices again.
             With N = 1 there is no one to hear from and round 2 repeats round 1.
    Group answer: the most frequent round-2 pick; a tie goes to the tied choice with the highest sum of round-2
             scores over all agents, then to the earliest choice. Accuracy = the group answer is the gold one.
    Also reported: the majority of round-1 picks (a vote without discussion) and the mean single-agent accuracy
    of each round.
    Each agent builds its document cache once per question and keeps it through both rounds: each round copies
    that cache and prefills only the question text after it. Agents with the same model, setting and input are
    deterministic, so each (model, setting, question, round-2 input) is scored once and shared. Before
    `score_choices` runs, all but the last question token are prefilled with logits for the last position only;
    the scores are those of `score_choices` on the whole pending prompt (checked: within 1e-5).

Memory (what is counted). The persistent, per-document KV cache that has to be kept for the agents to answer
from, KV only (keys and values of every layer; token ids, offsets and embeddings not counted), at 2 bytes per
value for native caches (fp16, the same convention as `cagkit eval`) and at the store dtype for the store; prompt
and question tokens are not counted (they are the same in both settings). Reported for the distinct documents
of the questions answered, as bytes per context token and in total:
    native  sum over the N agents of (the agent's model's KV bytes per token x the document tokens in that
            model's tokenizer): every agent keeps its own cache of every document.
    cagkit  the one shared stored source cache: smollm2 KV bytes per token at the store dtype x the stored source
            tokens, whatever N is (the KV files' size on disk is reported too).
Bytes per context token are per token of each model's own tokenizer (native: the sum of the agents' per-token
bytes). Transient memory, reported separately: while a cagkit agent answers it holds the document's KV placed
(and for gemma/qwen translated) in its own cache space; `transient_peak_agent_bytes` is the largest such cache
of one agent over the documents, `transient_all_agents_bytes` the sum over the N agents, if they all answered at
once.

Time. Bringing a question's documents into one agent's cache: native = prefill of prompt prefix + context;
cagkit = load from the store + translate (gemma, qwen; smollm2 reuses) + place with RoPE, prefix included. Per N
the sum over agents and questions is reported (measured once per model and question, counted for every agent of
that model), plus cagkit's one-time ingest (source prefill, chunking, embedding and writing; shared by all N;
its share by source tokens when the store holds more documents than the questions answered).

Output: the results JSON (rewritten after every question; a rerun with the same settings resumes) and a PNG with
two panels: KV memory against N and group accuracy against N, both settings.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import shlex
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from lab.multi_agent import MODEL_CYCLE, agent_models, discuss, native_memory, shared_memory, transient_memory

SETTINGS = ("cagkit", "native")
SOURCE = "smollm2"
NATIVE_BYTES_PER_VALUE = 2  # fp16 accounting for native caches, as `cagkit eval` reports them
# Results that may differ between a run and the file it resumes.
_RESUMABLE = ("limit", "command", "date", "wall_s")


# --- running the models


class AgentPool:
    """Builds each model's document cache once per question and setting, and scores question texts after it."""

    def __init__(self, models: dict, store, hits: list, question: str):
        self.models, self.store, self.hits, self.question = models, store, hits, question
        self.bases: dict[tuple[str, str], object] = {}
        self.doc: dict[str, dict[str, dict]] = {s: {} for s in SETTINGS}
        self.scored: dict[tuple[str, str, str], list[float]] = {}
        self.calls = {s: 0 for s in SETTINGS}
        self.scoring_ms = {s: 0.0 for s in SETTINGS}

    def scorer(self, setting: str, choices: list[str]) -> Callable[[str, str], list[float]]:
        def score(model: str, text: str) -> list[float]:
            key = (setting, model, text)
            if key not in self.scored:
                self.scored[key] = self._score(setting, model, text, choices)
            return self.scored[key]
        return score

    def _score(self, setting: str, model: str, text: str, choices: list[str]) -> list[float]:
        import torch

        from cagkit.ask import ContextCache
        from cagkit.evaluation.runner import score_choices
        from cagkit.generation import prompt_parts

        lm = self.models[model]
        base = self._base(setting, model)
        started = time.perf_counter()
        cache, suffix = copy.deepcopy(base.cache), prompt_parts(lm, text)[1]
        # score_choices computes logits over the whole vocabulary at every pending position but uses only the
        # last; prefilling all but the last question token here first gives the same scores, several times faster
        # for the 150k-260k-token vocabularies of gemma and qwen.
        if len(suffix) > 1:
            with torch.no_grad():
                lm.model(input_ids=torch.tensor([suffix[:-1]]), cache=cache, use_cache=True, logits_to_keep=1)
        context = ContextCache(cache, suffix[-1:], base.context_tokens, started, 0.0, base.mode)
        scores, _ = score_choices(lm, context, choices)
        self.calls[setting] += 1
        self.scoring_ms[setting] += (time.perf_counter() - started) * 1e3
        return scores

    def _base(self, setting: str, model: str):
        """The agent's cache holding prompt prefix + documents, built on first use, with its timings."""
        if (setting, model) in self.bases:
            return self.bases[(setting, model)]
        import torch

        from cagkit.ask import build_context_cache
        from cagkit.generation import prompt_parts

        lm = self.models[model]
        started = time.perf_counter()
        if setting == "cagkit":
            base = build_context_cache(lm, self.store, self.hits, self.question, "mot")
            done = time.perf_counter()
            timing = {"load_ms": (base.loaded_at - started) * 1e3, "translate_ms": base.translate_s * 1e3,
                      "place_ms": (done - base.loaded_at - base.translate_s) * 1e3}
        else:
            base = build_context_cache(lm, self.store, self.hits, self.question, "native")
            suffix = prompt_parts(lm, self.question)[1]
            document_ids = base.pending_ids[: len(base.pending_ids) - len(suffix)]
            assert document_ids + suffix == base.pending_ids
            with torch.no_grad():
                lm.model(input_ids=torch.tensor([document_ids]), cache=base.cache, use_cache=True,
                         logits_to_keep=1)
            done = time.perf_counter()
            base.pending_ids = suffix
            timing = {"tokenize_ms": (base.loaded_at - started) * 1e3, "prefill_ms": (done - base.loaded_at) * 1e3}
        self.doc[setting][model] = {"doc_ms": (done - started) * 1e3, "context_tokens": base.context_tokens,
                                    "mode": base.mode, **timing}
        self.bases[(setting, model)] = base
        return base


# --- the benchmark


def main() -> int:
    data_root = Path(os.environ.get("CAGKIT_DATA", "../shared/data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(data_root / "eval" / "race" / "race.jsonl"))
    parser.add_argument("--limit", type=int, default=40, help="questions (the first LIMIT of the data)")
    parser.add_argument("--agents", type=int, default=8, help="largest number of agents N")
    parser.add_argument("--out", default="results/multi_agent.json")
    parser.add_argument("--plot", default="docs/plots/multi_agent.png")
    parser.add_argument("--store", default=None, help="the shared store (default results/stores/multi_agent-<data>)")
    args = parser.parse_args()
    if args.agents < 1 or args.limit < 1:
        parser.error("--agents and --limit must be at least 1")

    import torch

    from cagkit.config import KV_DTYPES
    from cagkit.evaluation.datasets import detect_format, load_examples
    from cagkit.evaluation.runner import documents_dir, example_hits, write_documents
    from cagkit.bench import write_results
    from cagkit.ingest.pipeline import ingest
    from cagkit.models.loading import load_model
    from cagkit.store.store import Store

    wall_start = time.perf_counter()
    data_format = detect_format(args.data)
    examples = load_examples(args.data, data_format, args.limit)
    if any(e.choices is None for e in examples):
        raise SystemExit(f"{args.data}: every question needs choices; use a closed-set data set such as RACE")
    store_path = Path(args.store or f"results/stores/multi_agent-{Path(args.data).stem}-{SOURCE}")
    doc_paths = write_documents(examples, documents_dir(store_path))
    documents = sorted({p for paths in doc_paths for p in paths})
    _log(f"ingesting {len(documents)} documents with {SOURCE} into {store_path}")
    report = ingest(documents, store=store_path, source=SOURCE, progress=False)
    ingest_info = {"documents_added": len(report.added) + len(report.updated), "chunks": report.chunks,
                   "tokens": report.tokens, "seconds": report.seconds}

    used = sorted(set(agent_models(args.agents)), key=MODEL_CYCLE.index)
    models = {m: load_model(m) for m in used}
    out, plot = Path(args.out), Path(args.plot)
    with Store.open(store_path) as store:
        stored_bytes = KV_DTYPES[store.settings.dtype]
        results = {
            "data": str(args.data), "format": data_format, "agents": args.agents, "cycle": list(MODEL_CYCLE),
            "source": SOURCE, "store": str(store_path), "store_dtype": store.settings.dtype,
            "fingerprints": {m: lm.fingerprint for m, lm in models.items()},
            "limit": args.limit, "threads": torch.get_num_threads(),
            "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/multi_agent.py " + shlex.join(sys.argv[1:]),
            "date": datetime.date.today().isoformat(),
            "kv_bytes_per_token": {"native": {m: lm.kv_bytes_per_token(NATIVE_BYTES_PER_VALUE)
                                              for m, lm in models.items()},
                                   "stored_source": models[SOURCE].kv_bytes_per_token(stored_bytes)
                                   if SOURCE in models else load_model(SOURCE).kv_bytes_per_token(stored_bytes)},
            "memory_counted": "persistent per-document KV (keys+values, all layers) of the questions' distinct "
                              "documents; native at fp16, cagkit at the store dtype; prompt/question tokens not "
                              "counted; transient in-cache copies reported separately",
            "time_counted": "bringing each question's documents into each agent's cache; native: prefill of "
                            "prefix+context; cagkit: load+translate+place (+ one-time ingest)",
            "ingest": ingest_info, "documents": {}, "questions": [], "complete": False,
        }
        previous = _load_previous(out, results)
        if previous:
            results["documents"] = previous.get("documents", {})
            wanted = {e.id for e in examples}  # a smaller --limit keeps only its own questions
            results["questions"] = [q for q in previous.get("questions", []) if q["id"] in wanted]
            if not ingest_info["documents_added"]:  # the store was built by the run being resumed
                results["ingest"] = previous.get("ingest", ingest_info)
            results["wall_s_before"] = previous.get("wall_s", 0.0) + previous.get("wall_s_before", 0.0)
        done = {q["id"] for q in results["questions"]}
        for number, (example, paths) in enumerate(zip(examples, doc_paths), start=1):
            if example.id in done:
                continue
            started = time.perf_counter()
            hits = example_hits(store, example.question, paths, top_k=1, full_context=True)
            pool = AgentPool(models, store, hits, example.question)
            record = {"id": example.id, "answer_index": example.answer_index, "documents": _doc_key(paths),
                      "by_n": {s: {} for s in SETTINGS}}
            for setting in SETTINGS:
                score = pool.scorer(setting, example.choices)
                for n in range(1, args.agents + 1):
                    outcome = discuss(agent_models(n), example.question, example.choices, score)
                    outcome["correct"] = outcome["group"] == example.answer_index
                    outcome["round1_correct"] = outcome["round1_group"] == example.answer_index
                    record["by_n"][setting][str(n)] = outcome
            record["doc"] = pool.doc
            record["calls"], record["scoring_ms"] = pool.calls, pool.scoring_ms
            record["seconds"] = time.perf_counter() - started
            results["documents"].setdefault(record["documents"], _document_info(store, paths, pool))
            results["questions"].append(record)
            results["summary"] = summarize(results)
            results["wall_s"] = time.perf_counter() - wall_start
            write_results(out, results)
            _log(f"[{number}/{len(examples)}] {example.id} ({record['seconds']:.0f} s, "
                 f"{sum(pool.calls.values())} scorings): " + " | ".join(
                     f"{s} N=1..{args.agents} " + "".join("+" if record["by_n"][s][str(n)]["correct"] else "-"
                                                         for n in range(1, args.agents + 1)) for s in SETTINGS))
        results["summary"] = summarize(results)
        results["complete"] = {e.id for e in examples} <= {q["id"] for q in results["questions"]}
        results["wall_s"] = time.perf_counter() - wall_start
        write_results(out, results)
    write_plot(results, plot)
    _print_table(results)
    _log(f"wrote {out} and {plot}")
    return 0


def _doc_key(paths: list[str]) -> str:
    return "|".join(Path(p).name for p in paths)


def _document_info(store, paths: list[str], pool: AgentPool) -> dict:
    docs = [store.document(p) for p in paths]
    return {
        "source_tokens": sum(d.n_tokens for d in docs),
        # every KV file of a document: one written in parts (longer than a part's tokens) has one file per part
        "kv_file_bytes": sum((store.path / "kv" / name).stat().st_size for d in docs for name in store.kv_files(d)),
        "native_tokens": {m: v["context_tokens"] for m, v in pool.doc["native"].items()},
        "cagkit_tokens": {m: v["context_tokens"] for m, v in pool.doc["cagkit"].items()},
    }


def summarize(results: dict) -> dict:
    """Per N: group accuracy, memory and document-to-cache time of both settings."""
    questions, documents = results["questions"], results["documents"]
    kvb, stored = results["kv_bytes_per_token"]["native"], results["kv_bytes_per_token"]["stored_source"]
    native_tokens = {m: sum(d["native_tokens"][m] for d in documents.values()) for m in kvb}
    largest = {m: max((d["cagkit_tokens"][m] for d in documents.values()), default=0) for m in kvb}
    source_tokens = sum(d["source_tokens"] for d in documents.values())
    # The ingest may cover more documents than the questions answered (a run stopped early): its share by tokens.
    ingest = results["ingest"]
    ingest_ms = ingest["seconds"] * 1e3 * min(1.0, source_tokens / ingest["tokens"]) if ingest["tokens"] else 0.0
    rows = []
    for n in range(1, results["agents"] + 1):
        models = agent_models(n)
        row = {"n": n, "agents": models}
        for s in SETTINGS:
            outcomes = [q["by_n"][s][str(n)] for q in questions]
            row[f"accuracy_{s}"] = _mean(o["correct"] for o in outcomes)
            row[f"round1_vote_accuracy_{s}"] = _mean(o["round1_correct"] for o in outcomes)
            for r in (1, 2):
                row[f"agent_accuracy_round{r}_{s}"] = _mean(
                    p == q["answer_index"] for q in questions for p in q["by_n"][s][str(n)][f"picks{r}"])
            row[f"doc_to_cache_ms_{s}"] = sum(q["doc"][s][m]["doc_ms"] for q in questions for m in models)
        row["translate_ms_cagkit"] = sum(q["doc"]["cagkit"][m].get("translate_ms", 0.0)
                                         for q in questions for m in models)
        row["ingest_ms_cagkit"] = ingest_ms
        native = native_memory(models, kvb, native_tokens)
        shared = shared_memory(stored, source_tokens)
        row.update({f"native_{k}": v for k, v in native.items()})
        row.update({f"cagkit_{k}": v for k, v in shared.items()})
        row.update({f"cagkit_{k}": v for k, v in transient_memory(models, kvb, largest).items()})
        row["memory_ratio_native_over_cagkit"] = native["total_bytes"] / shared["total_bytes"] \
            if shared["total_bytes"] else None
        rows.append(row)
    return {"questions": len(questions), "documents": len(documents), "source_tokens": source_tokens,
            "native_tokens": native_tokens,
            "kv_file_bytes": sum(d["kv_file_bytes"] for d in documents.values()), "by_n": rows}


def _mean(values) -> float | None:
    values = [float(v) for v in values]
    return sum(values) / len(values) if values else None


# --- output


def write_plot(results: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = results["summary"]["by_n"]
    ns = [r["n"] for r in rows]
    figure = Figure(figsize=(10, 4.2))
    memory, accuracy = figure.subplots(1, 2)
    memory.plot(ns, [r["native_total_bytes"] / 2**20 for r in rows], "o-", color="C0",
                label="native: one cache per agent")
    memory.plot(ns, [r["cagkit_total_bytes"] / 2**20 for r in rows], "s-", color="C1",
                label="cagkit: one shared store")
    memory.plot(ns, [(r["cagkit_total_bytes"] + r["cagkit_transient_peak_agent_bytes"]) / 2**20 for r in rows], "s:",
                color="C1", alpha=0.6, label="cagkit: store + one answering agent's transient cache")
    memory.set_xlabel("agents N (smollm2, gemma, qwen, smollm2, ...)")
    memory.set_ylabel(f"KV MiB for the {results['summary']['documents']} documents")
    memory.set_ylim(0, 1.3 * max(r["native_total_bytes"] for r in rows) / 2**20)  # room for the legend
    memory.legend(fontsize=8, loc="upper left")
    for s, color, marker in (("cagkit", "C1", "s"), ("native", "C0", "o")):
        accuracy.plot(ns, [r[f"accuracy_{s}"] for r in rows], marker + "-", color=color,
                      label=f"{s}: group answer after discussion")
        accuracy.plot(ns, [r[f"round1_vote_accuracy_{s}"] for r in rows], marker + ":", color=color, alpha=0.6,
                      label=f"{s}: round-1 vote")
    accuracy.axhline(0.25, color="gray", linewidth=0.8, linestyle="--", label="chance (4 options)")
    accuracy.set_xlabel("agents N")
    accuracy.set_ylabel(f"accuracy ({results['summary']['questions']} questions)")
    accuracy.set_ylim(0, 1)
    accuracy.legend(fontsize=8)
    for axes in (memory, accuracy):
        axes.set_xticks(ns)
    figure.suptitle(f"Multi-agent discussion on {Path(results['data']).name}", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=120, bbox_inches="tight")


def _print_table(results: dict) -> None:
    print("| N | models | accuracy cagkit | accuracy native | KV cagkit (shared store) | KV native (per-agent) "
          "| docs→cache cagkit | docs→cache native |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in results["summary"]["by_n"]:
        counts = Counter(r["agents"])
        print(f"| {r['n']} | {' + '.join(f'{c} {m}' for m, c in counts.items())} | {r['accuracy_cagkit']:.3f} "
              f"| {r['accuracy_native']:.3f} | {r['cagkit_total_bytes'] / 2**20:.1f} MiB "
              f"({r['cagkit_bytes_per_context_token']:,} B/tok) | {r['native_total_bytes'] / 2**20:.1f} MiB "
              f"({r['native_bytes_per_context_token']:,} B/tok) "
              f"| {(r['ingest_ms_cagkit'] + r['doc_to_cache_ms_cagkit']) / 1e3:.1f} s "
              f"| {r['doc_to_cache_ms_native'] / 1e3:.1f} s |")


def _load_previous(out: Path, results: dict) -> dict:
    if not out.exists():
        return {}
    old = json.loads(out.read_text(encoding="utf-8"))
    keys = [k for k in results if k not in _RESUMABLE and k not in ("ingest", "documents", "questions", "complete")]
    changed = [k for k in keys if old.get(k) != results[k]]
    if changed:
        raise SystemExit(f"{out} holds a run with other settings ({', '.join(changed)} differ); "
                         "pass another --out or remove it")
    _log(f"resuming {out} ({len(old.get('questions', []))} questions done)")
    return old


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
