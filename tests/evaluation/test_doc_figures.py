"""The figures that README.md, docs/placement.md and docs/translators.md type in their sentences are the ones the
committed results files give: each sentence below is filled in from docs/results with
`cagkit.evaluation.report.compare` (the numbers `cagkit compare` prints) and must appear in its document as it stands.
A rerun that moves a figure fails here until the sentence is rewritten."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from cagkit.evaluation.report import compare

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def _spec(file: str, method: str) -> str:
    """`method` of `file`, or, where `method` is `OTHER.json:METHOD`, that method of the other file (runs over the
    same questions pair across files)."""
    other, _, name = method.rpartition(":")
    return f"{RESULTS / (other or file)}:{name}"


@cache
def _rows(file: str, method: str, baseline: str | None) -> list[dict]:
    """`compare` of `method` against `baseline` (against itself without one: compare needs two)."""
    return compare([_spec(file, baseline or method), _spec(file, method)])


def quality(file: str, method: str) -> str:
    """A method's mean quality (F1, or accuracy on closed-set data), as the documents write it."""
    return f"{_rows(file, method, None)[0]['quality']:.3f}"


@cache
def _median_seconds(file: str, method: str, key: str = "ttft_ms_median") -> float:
    return json.loads((RESULTS / file).read_text())["methods"][method][key] / 1e3


def seconds(file: str, method: str, key: str = "ttft_ms_median", digits: int = 2) -> str:
    """A method's median time to first token (or, by `key`, of its repair: `repair_ms_median`) in seconds, to two
    decimals as the report's frontier table writes it (or `digits`)."""
    return f"{_median_seconds(file, method, key):.{digits}f}"


def times(file: str, method: str, baseline: str) -> str:
    """How many times the baseline's median first token the method's is, to one decimal."""
    return f"{_median_seconds(file, method) / _median_seconds(file, baseline):.1f}"


def ratio(file: str, method: str, baseline: str, digits: int = 3) -> str:
    """The method's median first token as a share of the baseline's, to three decimals (or `digits`): `0.016`."""
    return f"{_median_seconds(file, method) / _median_seconds(file, baseline):.{digits}f}"


def same_answers(file: str, method: str, baseline: str) -> str:
    """On how many of the questions both answered the two gave the same answer: `30 of 30`."""
    runs = json.loads((RESULTS / file).read_text())["methods"]
    mine = {r["id"]: r["prediction"] for r in runs[method]["examples"]}
    theirs = {r["id"]: r["prediction"] for r in runs[baseline]["examples"]}
    shared = mine.keys() & theirs.keys()
    return f"{sum(mine[i] == theirs[i] for i in shared)} of {len(shared)}"


def same_across(file: str, other: str, method: str) -> str:
    """On how many of the questions both files' `method` answered they gave the same answer: `52 of 82`."""
    mine, theirs = ({r["id"]: r["prediction"] for r in json.loads((RESULTS / f).read_text())["methods"][method]
                     ["examples"]} for f in (file, other))
    shared = mine.keys() & theirs.keys()
    return f"{sum(mine[i] == theirs[i] for i in shared)} of {len(shared)}"


def _fewest_same(file: str, other: str, methods: tuple[str, ...]) -> int:
    """The fewest questions on which `methods` of the two files gave the same answer: every method's count."""
    return min(int(same_across(file, other, m).split()[0]) for m in methods)


def _bench_row(page: str, tokens: int) -> dict:
    """The row of a `cagkit bench` results file for the document of `tokens` tokens."""
    return next(r for r in json.loads((RESULTS / page).read_text())["rows"] if r["document_tokens"] == tokens)


def over_the_questions_of(file: str, method: str, other: str) -> str:
    """`method`'s mean quality in `file` over only the questions `other` (`FILE:METHOD`) answered: a longer run's
    score on a shorter run's questions."""
    def records(name: str, m: str) -> list[dict]:
        return json.loads((RESULTS / name).read_text())["methods"][m]["examples"]
    ids = {r["id"] for r in records(*other.split(":"))}
    mine = [r for r in records(file, method) if r["id"] in ids]
    return f"{sum(float(r['correct'] if 'correct' in r else r['f1']) for r in mine) / len(mine):.3f}"


def card(name: str, *keys: str) -> str:
    """A held-out score from a translator's card in docs/results/designs, to two decimals: `0.81`."""
    value = json.loads((RESULTS / "designs" / f"{name}.card.json").read_text())["heldout"]
    for key in keys:
        value = value[key]
    return f"{value:.2f}"


def bench_ratio(page: str, tokens: int, method: str, digits: int = 4) -> str:
    """A `cagkit bench` results file's median first token of `method` over native's, at the size of `tokens`."""
    return f"{_bench_row(page, tokens)['ratio_to_native'][method]:.{digits}f}"


def bench_megabytes(page: str, tokens: int, of: str = "store") -> str:
    """The document's KV on disk in a `cagkit bench` file: the store's, or (`of="torch_save"`) the saved cache's."""
    row = _bench_row(page, tokens)
    return f"{(row['store_kv_bytes'] if of == 'store' else row['torch_save']['bytes']) / 1e6:.1f} MB"


def bench_seconds(page: str, tokens: int, method: str, fmt: str = ".2f") -> str:
    """A method's median first token in a `cagkit bench` file, in seconds: `3.65`."""
    return f"{_bench_row(page, tokens)['ttft_ms'][method] / 1e3:{fmt}}"


def _bytes(store: str) -> float:
    return json.loads((RESULTS / "document-caches" / f"store-info-{store}.json").read_text())["kv_bytes_per_token"]


def bytes_per_token(store: str) -> str:
    """The KV bytes a stored token takes, from a saved `cagkit store info --json`: `3,532`."""
    info = json.loads((RESULTS / "document-caches" / f"store-info-{store}.json").read_text())
    return f"{info['kv_bytes_per_token']:,.0f}"


MMAP = "load-place-qwen-1.5b-mmap.json"


def _cold_ask() -> dict:
    """`benchmarks/cold_ask.py`'s results file."""
    return json.loads((RESULTS / "cold-ask-qwen.json").read_text())


def cold_ask(row: str, part: str) -> str:
    """A median of `benchmarks/cold_ask.py`'s file: `part` (place_ms, ttft_ms or ms) of `row`: `1,179 ms`."""
    return f"{_cold_ask()['medians'][row][part]:,.0f} ms"


def join_temperature(scale: float) -> str:
    """A row of `benchmarks/join_temperature.py`'s file: `18 of 30 (mean KL 0.600)`."""
    rows = json.loads((RESULTS / "join-temperature-qwen-1.5b.json").read_text())["rows"]
    row = next(r for r in rows if r["scale"] == scale)
    return f"{row['first_token_same']} of {row['n']} (mean KL {row['kl_mean']:.3f})"


def int4_variant(variant: str) -> str:
    """A row of `benchmarks/int4_keys.py`'s file: its bytes over float16's and its answers: `(0.281x) 18 of 30`."""
    rows = json.loads((RESULTS / "int4-keys-qwen.json").read_text())["rows"]
    row = next(r for r in rows if r["variant"] == variant)
    return f"({row['kv_fraction']:.3f}x) {row['same_answer']} of {row['n']}"


def load_place(page: str, store: str) -> str:
    """A `benchmarks/load_place.py` file's median load-plus-place time of the store whose path ends in `store`."""
    rows = json.loads((RESULTS / page).read_text())["rows"]
    return f"{next(r for r in rows if r['store'].endswith(store))['load_place_ms_median']:.0f} ms"


def load_place_read(page: str, read: str, part: str) -> str:
    """A `benchmarks/load_place.py --reads` file's median `part` (load, place or load_place) time of one read."""
    rows = json.loads((RESULTS / page).read_text())["rows"]
    return f"{next(r for r in rows if r['read'] == read)[part + '_ms_median']:.0f} ms"


def bench_part(page: str, tokens: int, part: str) -> str:
    """A part of the stored first token in a `cagkit bench` file's measured round: `load 78 ms`."""
    row = _bench_row(page, tokens)
    return f"{row['rounds'][-1]['stored'][part + '_ms']:,.0f} ms"


def load_share(page: str, tokens: int) -> str:
    """Load plus place as a share of the stored first token in a `cagkit bench` file's measured round: `7.1%`."""
    row = _bench_row(page, tokens)
    stored = row["rounds"][-1]["stored"]
    return f"{(stored['load_ms'] + stored['place_ms']) / stored['ttft_ms']:.1%}"


def bench_same(page: str, tokens: int) -> bool:
    row = _bench_row(page, tokens)
    return row["stored_equals_native"]


def _signed(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def difference(file: str, method: str, baseline: str, style: str = "brackets") -> str:
    """`method − baseline` paired over the questions both answered, with its 95% interval: `+0.044 (+0.003 to
    +0.087)`, or, in `style="commas"`, `+0.044, +0.003 to +0.087` (for a sentence already in brackets)."""
    d = _rows(file, method, baseline)[1]["difference"]
    mean, low, high = (_signed(d[k]) for k in ("mean", "low", "high"))
    return f"{mean} ({low} to {high})" if style == "brackets" else f"{mean}, {low} to {high}"


def gap(file: str, method: str, control: str, reference: str) -> str:
    """The share of `reference`'s lead over `control` that `method` closes, with its interval, as `cagkit compare
    --gap-to` gives it: `39% (1% to 79%)`. Each name may be `OTHER.json:METHOD`."""
    g = compare([_spec(file, control), _spec(file, method)], gap_to=_spec(file, reference))[1]["gap_closed"]
    return f"{g['share']:.0%} ({g['low']:.0%} to {g['high']:.0%})".replace("-", "−")


SQUAD_QWEN, SQUAD_GEMMA = "squad_v2-smollm2-qwen.json", "squad_v2-smollm2-gemma.json"
SQUAD_GEMMA_16, REUSE = "squad_v2-smollm2-gemma-k16.json", "squad_v2-smollm2-smollm2.json"
QUALITY_QWEN_GEMMA_16 = "quality-qwen-gemma-k16.json"
HOTPOT_GEMMA, HOTPOT_QWEN = "hotpotqa-smollm2-gemma.json", "hotpotqa-smollm2-qwen.json"
ORACLE_GEMMA, ORACLE_QWEN = "hotpotqa-smollm2-gemma-oracle.json", "hotpotqa-smollm2-qwen-oracle.json"
HOTPOT_QWEN_15, ORACLE_QWEN_15 = "hotpotqa-smollm2-qwen-1.5b.json", "hotpotqa-smollm2-qwen-1.5b-oracle.json"
# the smollm2 -> qwen-1.5b translator trained with the shipped design (docs/translators.md); the one-chunk file also
# holds the target's own none and oracle
DESIGN_ONE_CHUNK_15 = "designs/squad_v2-smollm2-qwen-1.5b-k1-q15.json"
DESIGN_HOTPOT_15 = "designs/hotpotqa-smollm2-qwen-1.5b-q15.json"
# document caches (docs/document-caches.md): stores written by the answering model, every method at document scope
# unless its name says @chunks; native on the first questions only (it equals stored by construction)
DOC_QWEN, DOC_QWEN_MORE = "document-caches/squad_v2-qwen-doc.json", "document-caches/squad_v2-qwen-doc-200.json"
DOC_QWEN_15, DOC_GEMMA_MORE = "document-caches/squad_v2-qwen-1.5b-doc.json", "document-caches/squad_v2-gemma-doc-200.json"
DOC_QWEN_15_NATIVE, DOC_GEMMA = "document-caches/squad_v2-qwen-1.5b-doc-native.json", "document-caches/squad_v2-gemma-doc.json"
DOC_FOCUS, DOC_FOCUS_15 = "document-caches/squad_v2-qwen-doc-focus.json", "document-caches/squad_v2-qwen-1.5b-doc-focus.json"
# the same stores written in int4 or int8 (docs/speed.md), and what `cagkit store info --json` said of them
DOC_QWEN_INT4, DOC_QWEN_INT8 = "document-caches/squad_v2-qwen-doc-int4.json", "document-caches/squad_v2-qwen-doc-int8.json"
DOC_QWEN_15_INT4 = "document-caches/squad_v2-qwen-1.5b-doc-int4.json"
# int4 with its refined keys: copies of the float16 stores (qwen, SQuAD; qwen-1.5b, HotpotQA's 100 questions)
DOC_QWEN_INT4R, HOTPOT_15_INT4R = ("document-caches/squad_v2-qwen-doc-int4r.json",
                                   "document-caches/hotpotqa-qwen-1.5b-doc-int4r.json")
DOC_TRANSLATED = "document-caches/squad_v2-smollm2-gemma-doc.json"  # smollm2's store read by gemma, translated
DOC_TRANSLATED_QWEN = "document-caches/squad_v2-smollm2-qwen-doc.json"  # the same store read by qwen
DOC_TRANSLATED_15 = "document-caches/squad_v2-smollm2-qwen-1.5b-doc.json"  # and by qwen-1.5b, a ridge translator
# HotpotQA's paragraphs, each its own document cached apart by qwen-1.5b, joined; the repairs in a run beside it
JOINED, JOINS = "document-caches/hotpotqa-qwen-1.5b-doc.json", "document-caches/hotpotqa-qwen-1.5b-doc-joins.json"
JOINS_TIME = "document-caches/hotpotqa-qwen-1.5b-doc-joins-time.json"  # the same, 10 questions, timed beside native
# CacheBlend's rule at 30% over the same 100 questions, and timed beside native over the first 10
BLEND30 = "document-caches/hotpotqa-qwen-1.5b-doc-blend30.json:stored+deviation"
BLEND30_TIME = "document-caches/hotpotqa-qwen-1.5b-doc-blend30-time.json"
BLEND30_ALONE = "document-caches/hotpotqa-qwen-1.5b-doc-blend30-alone.json"  # the same, nothing else running
ALONE_METHODS = ("native", "stored", "stored+deviation")
# at 10% over the first 60 questions, and timed alone over the first 10 beside the same command at 30%, run next
BLEND10 = "document-caches/hotpotqa-qwen-1.5b-doc-blend10.json:stored+deviation"
BLEND10_ALONE = "document-caches/hotpotqa-qwen-1.5b-doc-blend10-alone.json"
BLEND30_ALONE2 = "document-caches/hotpotqa-qwen-1.5b-doc-blend30-alone2.json"
BLEND20 = "document-caches/hotpotqa-qwen-1.5b-doc-blend20.json:stored+deviation"  # and at 20%
BLEND20_TIME = "document-caches/hotpotqa-qwen-1.5b-doc-blend20-time.json"
QWEN_BLEND30 = "document-caches/hotpotqa-qwen-doc-blend30.json:stored+deviation"  # qwen's joins, 30% recomputed
TRANSLATED_BLEND30 = "document-caches/hotpotqa-qwen-qwen-1.5b-doc-blend30.json:linear+deviation"  # its first 60
STORIES, STORIES_NATIVE = "document-caches/quality-qwen-doc.json", "document-caches/quality-qwen-doc-native.json"
STORIES_15 = "document-caches/quality-qwen-1.5b-doc.json"  # qwen-1.5b's own caches, all 94 questions of part a
STORIES_GEMMA = "document-caches/quality-gemma-doc.json"  # gemma's own caches, all 94; native on the first 30
JOINED_GEMMA = "document-caches/hotpotqa-gemma-doc.json"  # the same joins with gemma's own caches, 200 questions
JOINED_QWEN = "document-caches/hotpotqa-qwen-doc.json"  # the same joins with qwen's own caches, 200 questions
# qwen's store of the same paragraphs read by qwen-1.5b through a ridge translator fitted on 1k-token passages
TRANSLATED_15 = "document-caches/hotpotqa-qwen-qwen-1.5b-doc.json"
# the same with qwen-1.5b prefilling its bottom 2 or 14 layers of each paragraph (--recompute-layers), 30 questions
TRANSLATED_15_R2 = "document-caches/hotpotqa-qwen-qwen-1.5b-doc-r2.json"
TRANSLATED_15_R14 = "document-caches/hotpotqa-qwen-qwen-1.5b-doc-r14.json"
# K = 7 and 21, the same 30 questions, through the ridge refitted on the same passages
TRANSLATED_15_R7 = "document-caches/hotpotqa-qwen-qwen-1.5b-doc-r7.json"
# CacheBlend's gradual filtering (a rule since removed) at 15% and 20%, the first 60 questions
GRADUAL15 = "document-caches/hotpotqa-qwen-1.5b-doc-gradual15.json:stored+gradual"
GRADUAL20 = "document-caches/hotpotqa-qwen-1.5b-doc-gradual2.json:stored+gradual"
# the three repair rules at 30% with qwen-1.5b's own caches, and select at that share, one run, 60 questions
RULES30 = "document-caches/hotpotqa-qwen-1.5b-doc-rules30.json"
# qwen's own chunks of SQuAD placed apart, repaired by CacheBlend's rule instead of the question's, 60 questions
CHUNKS_DEVIATION = "document-caches/squad_v2-qwen-doc-chunks-deviation.json"
TRANSLATED_15_R21 = "document-caches/hotpotqa-qwen-qwen-1.5b-doc-r21.json"
# int8 and int4 copies of qwen-1.5b's HotpotQA store (`store migrate --dtype`), `stored` over the first 60 questions
JOINED_INT8, JOINED_INT4 = "document-caches/hotpotqa-qwen-1.5b-doc-int8.json", "document-caches/hotpotqa-qwen-1.5b-doc-int4.json"
DOC_QWEN_15_INT8 = "document-caches/squad_v2-qwen-1.5b-doc-int8.json"  # an int8 copy of qwen-1.5b's SQuAD store
# smollm2's store of the same paragraphs read by qwen and by gemma through the shipped translators, 100 questions
FROM_SMOLLM2_QWEN = "document-caches/hotpotqa-smollm2-qwen-doc.json"
FROM_SMOLLM2_GEMMA = "document-caches/hotpotqa-smollm2-gemma-doc.json"
# qwen's store read by qwen-1.5b through the ridge with 30% of the sentences recomputed by the question's rule, and
# select at that share: the same 60 questions
QUESTION30 = "document-caches/hotpotqa-qwen-qwen-1.5b-doc-question30.json:linear+question"
SELECT30 = "document-caches/hotpotqa-qwen-qwen-1.5b-doc-select30.json:select@chunks"
TRANSLATED_TTFT = "bench-qwen-qwen-1.5b-translated.json"  # `cagkit bench --source qwen`, 4k tokens, one round
# qwen's QuALITY stories read by qwen-1.5b through the ridge and the MoT fitted on 1k-token passages, 40 questions
STORIES_TRANSLATED = "document-caches/quality-qwen-qwen-1.5b-doc.json:linear"
STORIES_TRANSLATED_MOT = "document-caches/quality-qwen-qwen-1.5b-doc-mot.json:mot"
# smollm2's store of the paragraphs read by qwen-1.5b through a ridge fitted on 1k-token passages, 60 questions
FROM_SMOLLM2_15 = "document-caches/hotpotqa-smollm2-qwen-1.5b-doc.json"
# and smollm2's store of QuALITY's stories read by qwen-1.5b (the same ridge), qwen and gemma, 40 questions
STORIES_FROM_SMOLLM2_15 = "document-caches/quality-smollm2-qwen-1.5b-doc.json"
STORIES_FROM_SMOLLM2_QWEN = "document-caches/quality-smollm2-qwen-doc.json"
STORIES_FROM_SMOLLM2_GEMMA = "document-caches/quality-smollm2-gemma-doc.json"
# the MoT fitted on the same 1k-token passages: as placed, and with 30% recomputed by the question's rule
TRANSLATED_MOT = "document-caches/hotpotqa-qwen-qwen-1.5b-doc-mot.json"
SQUAD_TRANSLATED_15 = "document-caches/squad_v2-qwen-qwen-1.5b-doc.json"  # qwen's SQuAD store, the same two, 30 q
TTFT_15 = "document-ttft-qwen-1.5b.json"  # `cagkit bench` of qwen-1.5b, 512 to 16k tokens

SENTENCES = {
    "README.md": [
        lambda: f"(`--blend 0.3 --blend-select deviation`, CacheBlend's rule) reached "
                f"{quality(BLEND30.split(':')[0], 'stored+deviation')}",
        lambda: f"at 16k (qwen-1.5b {float(bench_ratio(TTFT_15, 16393, 'stored')):.3f}, gemma "
                f"{bench_ratio('bench-gemma-16k.json', 16385, 'stored')})",
        lambda: f"native prefill's answer on {same_answers(DOC_QWEN, 'stored', 'native')} questions at "
                f"{ratio(DOC_QWEN, 'stored', 'native')} of native's first-token time",
        lambda: f"{quality(DOC_QWEN_15, 'stored')} F1 against {quality(DOC_QWEN_15, 'select@chunks')} with qwen-1.5b "
                f"({difference(DOC_QWEN_15, 'stored', 'select@chunks', 'commas')})",
        lambda: f"{quality(DOC_QWEN_MORE, 'stored')} against {quality(DOC_QWEN_MORE, 'select@chunks')} with qwen "
                f"({difference(DOC_QWEN_MORE, 'stored', 'select@chunks', 'commas')})",
        lambda: f"qwen-1.5b's own caches did beat select, {quality(JOINED, 'stored')} against "
                f"{quality(JOINED, 'select@chunks')} ({difference(JOINED, 'stored', 'select@chunks', 'commas')}), at "
                f"{ratio(JOINED, 'stored', 'select@chunks')} of its first-token time, yet stayed below native prefill's "
                f"{quality(JOINED, 'native')}",
        lambda: f"select scores {quality(SQUAD_QWEN, 'select')} F1 against {quality(SQUAD_QWEN, 'mot')}",
        lambda: f"translated KV score higher ({quality(SQUAD_GEMMA, 'mot')} against {quality(SQUAD_GEMMA, 'select')}) "
                f"at {times(SQUAD_GEMMA, 'mot', 'select')} times the wait",
        lambda: f"scores lower ({quality(SQUAD_GEMMA_16, 'mot')} against {quality(SQUAD_GEMMA_16, 'select')})",
    ],
    "docs/placement.md": [
        lambda: f"(at 30% {difference(RULES30, 'stored+initial', 'stored+deviation', 'commas')})",
        lambda: f"placed as translated scored {quality(QUALITY_QWEN_GEMMA_16, 'mot-placed')} against select's "
                f"{quality(QUALITY_QWEN_GEMMA_16, 'select')} and answered sooner "
                f"({seconds(QUALITY_QWEN_GEMMA_16, 'mot-placed')} against {seconds(QUALITY_QWEN_GEMMA_16, 'select')} s)",
        lambda: f"scored {quality(REUSE, 'source')} F1 at top-4 against select's {quality(REUSE, 'select')}, "
                f"{difference(REUSE, 'source', 'select')}",
        lambda: f"its native prefill of the four chunks {quality(REUSE, 'native')}",
        lambda: f"qwen's native prefill also scores below select there "
                f"({difference(SQUAD_QWEN, 'native', 'select', 'commas')})",
        lambda: f"gemma's within noise of it ({difference(SQUAD_GEMMA, 'native', 'select', 'commas')})",
        lambda: f"native beats select by {difference(HOTPOT_GEMMA, 'native', 'select')} with gemma and "
                f"{difference(HOTPOT_QWEN, 'native', 'select')} with qwen",
        lambda: f"it scores {quality(ORACLE_GEMMA, 'oracle')} F1 with gemma against select's "
                f"{quality(HOTPOT_GEMMA, 'select')}, {difference(HOTPOT_GEMMA, ORACLE_GEMMA + ':oracle', 'select')}, and "
                f"{quality(ORACLE_QWEN, 'oracle')} with qwen against {quality(HOTPOT_QWEN, 'select')}, "
                f"{difference(HOTPOT_QWEN, ORACLE_QWEN + ':oracle', 'select')}",
        lambda: f"(`mot` − select: {difference(HOTPOT_GEMMA, 'mot', 'select').split()[0]} with gemma, "
                f"{difference(HOTPOT_QWEN, 'mot', 'select').split()[0]} with qwen)",
        lambda: f"its repair alone takes a median of {seconds(HOTPOT_GEMMA, 'mot', 'repair_ms_median')} s with gemma, "
                f"against select's whole first token at {seconds(HOTPOT_GEMMA, 'select')} s, and "
                f"{seconds(HOTPOT_QWEN, 'mot', 'repair_ms_median')} s with qwen, against {seconds(HOTPOT_QWEN, 'select')} s",
        lambda: f"native scores {quality(HOTPOT_QWEN_15, 'native')} F1 and select {quality(HOTPOT_QWEN_15, 'select')}, "
                f"{difference(HOTPOT_QWEN_15, 'native', 'select')}; no context scores {quality(HOTPOT_QWEN_15, 'none')}",
        lambda: f"beats select beyond noise over the same questions: "
                f"{difference(HOTPOT_QWEN_15, ORACLE_QWEN_15 + ':oracle', 'select')}",
        lambda: f"its repair alone took a median of {seconds(ORACLE_QWEN_15, 'oracle', 'repair_ms_median')} s, against "
                f"select's whole first token at {seconds(HOTPOT_QWEN_15, 'select')} s",
        lambda: f"its default placement scores {difference(DESIGN_HOTPOT_15, 'mot', 'select')} against select",
    ],
    "docs/document-caches.md": [
        lambda: f"`--threads 2`): {quality(BLEND10.split(':')[0], 'stored+deviation')}, native "
                f"{difference(JOINED, BLEND10, 'native')}, keeping {gap(JOINED, BLEND10, 'select@chunks', 'native')} "
                f"of the lead, and {difference(JOINS, BLEND10, 'stored+deviation')} against 15% recomputed (the same "
                f"answer on {same_across(BLEND10.split(':')[0], JOINS, 'stored+deviation')})",
        lambda: f"10% took {ratio(BLEND10_ALONE, 'stored+deviation', 'native')} of native's first token (the repair a "
                f"median of {seconds(BLEND10_ALONE, 'stored+deviation', 'repair_ms_median')} s of the "
                f"{seconds(BLEND10_ALONE, 'stored+deviation')} s, native {seconds(BLEND10_ALONE, 'native')} s)",
        lambda: f"(`-blend30-alone2`; every method gave the same {_fewest_same(BLEND30_ALONE2, BLEND30_ALONE, ALONE_METHODS)} "
                f"answers as there), {ratio(BLEND30_ALONE2, 'stored+deviation', 'native')} (the repair "
                f"{seconds(BLEND30_ALONE2, 'stored+deviation', 'repair_ms_median')} s, native "
                f"{seconds(BLEND30_ALONE2, 'native')} s)",
        lambda: f"method gave the same {_fewest_same(BLEND30_ALONE, BLEND30_TIME, ALONE_METHODS)} answers), 30% took {ratio(BLEND30_ALONE, 'stored+deviation', 'native')} of native's first token: "
                f"the repair a median of {seconds(BLEND30_ALONE, 'stored+deviation', 'repair_ms_median')} s, native "
                f"{seconds(BLEND30_ALONE, 'native')} s",
        lambda: f"questions): {quality(GRADUAL15.split(':')[0], 'stored+gradual')} at 15% and "
                f"{quality(GRADUAL20.split(':')[0], 'stored+gradual')} at 20%, against the deviation in one pass at "
                f"the same share {difference(JOINS, GRADUAL15, 'stored+deviation')} and "
                f"{difference(BLEND20.split(':')[0], GRADUAL20, 'stored+deviation')}, and against native "
                f"{difference(JOINED, GRADUAL15, 'native')} and {difference(JOINED, GRADUAL20, 'native')}",
        lambda: f"select gave the same answers on {same_across(CHUNKS_DEVIATION, DOC_QWEN_MORE, 'select@chunks')}): "
                f"{quality(CHUNKS_DEVIATION, 'stored+deviation@chunks')} against the question's rule's "
                f"{over_the_questions_of(DOC_QWEN_MORE, 'stored@chunks', CHUNKS_DEVIATION + ':select@chunks')} on those "
                f"questions, {difference(DOC_QWEN_MORE, CHUNKS_DEVIATION + ':stored+deviation@chunks', 'stored@chunks')}, "
                f"and {difference(CHUNKS_DEVIATION, 'stored+deviation@chunks', 'select@chunks')} against select's "
                f"{quality(CHUNKS_DEVIATION, 'select@chunks')}",
        lambda: f"gave the earlier runs' answers on {same_across(RULES30, SELECT30.split(':')[0], 'select@chunks')} "
                f"each): CacheBlend's deviation {quality(RULES30, 'stored+deviation')}, EPIC's first tokens of each "
                f"document {quality(RULES30, 'stored+initial')}, the question's sentences "
                f"{quality(RULES30, 'stored+question')}, select at that share {quality(RULES30, 'select@chunks')}",
        lambda: f"beats the join as stored beyond noise ({difference(JOINED, RULES30 + ':stored+deviation', 'stored', 'commas')}; "
                f"EPIC {difference(JOINED, RULES30 + ':stored+initial', 'stored', 'commas')}; the question's sentences "
                f"{difference(JOINED, RULES30 + ':stored+question', 'stored', 'commas')})",
        lambda: f"within noise of native ({difference(JOINED, RULES30 + ':stored+deviation', 'native', 'commas')}; EPIC "
                f"{difference(JOINED, RULES30 + ':stored+initial', 'native', 'commas')}; the question's sentences "
                f"{difference(JOINED, RULES30 + ':stored+question', 'native', 'commas')}); EPIC against the deviation "
                f"{difference(RULES30, 'stored+initial', 'stored+deviation')}",
        lambda: f"(repair medians {seconds(RULES30, 'stored+initial', 'repair_ms_median', 1)} to "
                f"{seconds(RULES30, 'stored+deviation', 'repair_ms_median', 1)} s in this run; select at 30% "
                f"answered at {ratio(RULES30, 'select@chunks', 'stored+deviation', 2)} of the deviation's first",
        lambda: f"the earlier runs' answers on {same_across(RULES30, BLEND30.split(':')[0], 'stored+deviation')} each",
        lambda: f"K = 7, {quality(TRANSLATED_15_R7, 'linear')}, "
                f"{difference(TRANSLATED_15, TRANSLATED_15_R7 + ':linear', 'linear')} over translated throughout and "
                f"{difference(TRANSLATED_15, TRANSLATED_15_R7 + ':linear', 'select@chunks')} against select; K = 21",
        lambda: f"own, {quality(TRANSLATED_15_R21, 'linear')}, no better than K = 14 and "
                f"{difference(TRANSLATED_15, TRANSLATED_15_R21 + ':linear', 'select@chunks')} against select, where "
                f"native (K = 28) scores {over_the_questions_of(JOINED, 'native', TRANSLATED_15_R21 + ':linear')} on these",
        lambda: f"the MoT {quality(STORIES_FROM_SMOLLM2_GEMMA, 'mot')} and the ridge "
                f"{quality(STORIES_FROM_SMOLLM2_GEMMA, 'linear')} against select's "
                f"{quality(STORIES_FROM_SMOLLM2_GEMMA, 'select@chunks')} (MoT − select "
                f"{difference(STORIES_FROM_SMOLLM2_GEMMA, 'mot', 'select@chunks', 'commas')}; ridge − select "
                f"{difference(STORIES_FROM_SMOLLM2_GEMMA, 'linear', 'select@chunks', 'commas')}), no context "
                f"{quality(STORIES_FROM_SMOLLM2_GEMMA, 'none')}",
        lambda: f"the ridge {quality(STORIES_FROM_SMOLLM2_15, 'linear')} accuracy against select's "
                f"{quality(STORIES_FROM_SMOLLM2_15, 'select@chunks')}, "
                f"{difference(STORIES_FROM_SMOLLM2_15, 'linear', 'select@chunks')}, and no context "
                f"{quality(STORIES_FROM_SMOLLM2_15, 'none')}: the same as qwen's store through its ridge "
                f"({quality(STORIES_TRANSLATED.split(':')[0], 'linear')}, above)",
        lambda: f"qwen-1.5b's own stored stories scored "
                f"{over_the_questions_of(STORIES_15, 'stored', STORIES_FROM_SMOLLM2_15 + ':linear')} on these questions",
        lambda: f"the MoT {quality(STORIES_FROM_SMOLLM2_QWEN, 'mot')} and the ridge "
                f"{quality(STORIES_FROM_SMOLLM2_QWEN, 'linear')} against select's "
                f"{quality(STORIES_FROM_SMOLLM2_QWEN, 'select@chunks')} (MoT − select "
                f"{difference(STORIES_FROM_SMOLLM2_QWEN, 'mot', 'select@chunks', 'commas')}; ridge − select "
                f"{difference(STORIES_FROM_SMOLLM2_QWEN, 'linear', 'select@chunks', 'commas')}), no context "
                f"{quality(STORIES_FROM_SMOLLM2_QWEN, 'none')} too",
        lambda: f"joined as translated, {quality(FROM_SMOLLM2_15, 'linear')} F1 against select's "
                f"{quality(FROM_SMOLLM2_15, 'select@chunks')} in the same run, "
                f"{difference(FROM_SMOLLM2_15, 'linear', 'select@chunks')}, and no better than no context "
                f"({quality(FROM_SMOLLM2_15, 'none')}), closing {gap(FROM_SMOLLM2_15, 'linear', 'select@chunks', JOINED + ':native')}"
                f" of native's lead over select",
        lambda: f"leads select by {difference(FROM_SMOLLM2_15, JOINED + ':native', 'select@chunks', 'commas')}, on these",
        lambda: f"CacheBlend's repair of 15% of the tokens, {quality(FROM_SMOLLM2_15, 'linear+deviation')}, "
                f"{difference(FROM_SMOLLM2_15, 'linear+deviation', 'select@chunks')} against select, closing "
                f"{gap(FROM_SMOLLM2_15, 'linear+deviation', 'select@chunks', JOINED + ':native')}",
        lambda: f"translated ({over_the_questions_of(TRANSLATED_15, 'linear', FROM_SMOLLM2_15 + ':linear')} over the same",
        lambda: f"select at 30% scored {quality('document-caches/squad_v2-qwen-1.5b-select30.json', 'select@chunks')}, "
                f"{difference(DOC_QWEN_15, 'document-caches/squad_v2-qwen-1.5b-select30.json:select@chunks', 'select@chunks')} "
                f"over its 15%",
        lambda: f"translators scored {quality(SQUAD_TRANSLATED_15, 'linear')} (ridge) and "
                f"{quality(SQUAD_TRANSLATED_15, 'mot')} (MoT) F1 against select's "
                f"{over_the_questions_of(DOC_QWEN_15, 'select@chunks', SQUAD_TRANSLATED_15 + ':linear')} (ridge − select "
                f"{difference(DOC_QWEN_15, SQUAD_TRANSLATED_15 + ':linear', 'select@chunks', 'commas')}; MoT − select "
                f"{difference(DOC_QWEN_15, SQUAD_TRANSLATED_15 + ':mot', 'select@chunks', 'commas')})",
        lambda: f"(30% − 15% of the sentences "
                f"{difference(TRANSLATED_15, SELECT30, 'select@chunks', 'commas')}, the same 60 questions)",
        lambda: f"`--target qwen`: {quality('document-caches/hotpotqa-qwen-doc-select30.json', 'select@chunks')}, "
                f"{difference(JOINED_QWEN, 'document-caches/hotpotqa-qwen-doc-select30.json:select@chunks', 'select@chunks', 'commas')},",
        lambda: f"scored {quality(SELECT30.split(':')[0], 'select@chunks')} over the first 60 questions. Against it, the "
                f"join as stored is {difference(SELECT30.split(':')[0], JOINED + ':stored', 'select@chunks')} and 30% "
                f"recomputed by CacheBlend's rule {difference(SELECT30.split(':')[0], BLEND30, 'select@chunks')}",
        lambda: f"translated, {quality(TRANSLATED_MOT, 'mot-placed')} F1, "
                f"{difference(TRANSLATED_15, TRANSLATED_MOT + ':mot-placed', 'linear')} over the ridge and "
                f"{difference(TRANSLATED_15, TRANSLATED_MOT + ':mot-placed', 'select@chunks')} against select",
        lambda: f"with the question's sentences recomputed at 30%, {quality(TRANSLATED_MOT, 'mot+question')}, "
                f"{difference(SELECT30.split(':')[0], TRANSLATED_MOT + ':mot+question', 'select@chunks')} against "
                f"select at that",
        lambda: f"the ridge {quality(STORIES_TRANSLATED.split(':')[0], 'linear')} accuracy and the MoT "
                f"{quality(STORIES_TRANSLATED_MOT.split(':')[0], 'mot')} against select's "
                f"{over_the_questions_of(STORIES_15, 'select@chunks', STORIES_TRANSLATED)} "
                f"(ridge − select {difference(STORIES_15, STORIES_TRANSLATED, 'select@chunks', 'commas')}; MoT − "
                f"select {difference(STORIES_15, STORIES_TRANSLATED_MOT, 'select@chunks', 'commas')}), where "
                f"qwen-1.5b's own stored stories scored {over_the_questions_of(STORIES_15, 'stored', STORIES_TRANSLATED)} "
                f"and no context {over_the_questions_of(STORIES_15, 'none', STORIES_TRANSLATED)}",
        lambda: f"{quality(QUESTION30.split(':')[0], 'linear+question')}, "
                f"{difference(TRANSLATED_15, QUESTION30, 'select@chunks')} against select at its default share, "
                f"closing {gap(TRANSLATED_15, QUESTION30, 'select@chunks', JOINED + ':native')} of native's lead",
        lambda: f"scored {quality(SELECT30.split(':')[0], 'select@chunks')}, and the translated rest beside those "
                f"sentences is {difference(TRANSLATED_15, QUESTION30, SELECT30)} against it",
        lambda: f"stored KV of a {_bench_row(TRANSLATED_TTFT, 4091)['document_tokens']:,}-token document translated "
                f"and placed whole gave qwen-1.5b's first token at {bench_ratio(TRANSLATED_TTFT, 4091, 'translated')} "
                f"of native prefill's ({_bench_row(TRANSLATED_TTFT, 4091)['parts_ms']['translated']['translate_ms'] / 1e3:.3f}"
                f" s of it the translation), against {bench_ratio(TRANSLATED_TTFT, 4091, 'stored')} for qwen-1.5b's own "
                f"stored cache; qwen's ingest of the document took "
                f"{_bench_row(TRANSLATED_TTFT, 4091)['source_ingest']['seconds']:.0f} s against qwen-1.5b's "
                f"{_bench_row(TRANSLATED_TTFT, 4091)['ingest']['seconds']:.0f} s",
        lambda: "native's (\"{translated}\" against \"{native}\")".format(
            **_bench_row(TRANSLATED_TTFT, 4091)["first_token"]),
        lambda: f"the MoT {quality(FROM_SMOLLM2_QWEN, 'mot')} F1 and ridge {quality(FROM_SMOLLM2_QWEN, 'linear')} "
                f"against select's {quality(FROM_SMOLLM2_QWEN, 'select')} in the same run (MoT − select "
                f"{difference(FROM_SMOLLM2_QWEN, 'mot', 'select', 'commas')}; ridge − select "
                f"{difference(FROM_SMOLLM2_QWEN, 'linear', 'select', 'commas')}), below no context "
                f"({quality(FROM_SMOLLM2_QWEN, 'none')}) too",
        lambda: f"the MoT {quality(FROM_SMOLLM2_GEMMA, 'mot')} and ridge {quality(FROM_SMOLLM2_GEMMA, 'linear')} "
                f"against select's {quality(FROM_SMOLLM2_GEMMA, 'select')} (MoT − select "
                f"{difference(FROM_SMOLLM2_GEMMA, 'mot', 'select', 'commas')}; ridge − select "
                f"{difference(FROM_SMOLLM2_GEMMA, 'linear', 'select', 'commas')}); no context "
                f"{quality(FROM_SMOLLM2_GEMMA, 'none')}",
        lambda: f"(qwen's own native, `hotpotqa-qwen-doc.json`: "
                f"{difference(FROM_SMOLLM2_QWEN, JOINED_QWEN + ':native', 'select', 'commas')}; gemma's: "
                f"{difference(FROM_SMOLLM2_GEMMA, JOINED_GEMMA + ':native', 'select', 'commas')})",
        lambda: f"native {quality(JOINED_QWEN, 'native')}, select {quality(JOINED_QWEN, 'select@chunks')}, no context "
                f"{quality(JOINED_QWEN, 'none')}, the join as stored {quality(JOINED_QWEN, 'stored')} (stored − select "
                f"{difference(JOINED_QWEN, 'stored', 'select@chunks', 'commas')}; native − select "
                f"{difference(JOINED_QWEN, 'native', 'select@chunks', 'commas')}; stored − native "
                f"{difference(JOINED_QWEN, 'stored', 'native', 'commas')}; the join gave native's answer on "
                f"{same_answers(JOINED_QWEN, 'stored', 'native')}",
        lambda: f"The join answered at {ratio(JOINED_QWEN, 'stored', 'native')} of native's first-token time and "
                f"{ratio(JOINED_QWEN, 'stored', 'select@chunks')} of select's",
        lambda: f"with K = 2, {quality(TRANSLATED_15_R2, 'linear')}, the same as translated throughout "
                f"({difference(TRANSLATED_15, TRANSLATED_15_R2 + ':linear', 'linear', 'commas')}); with K = 14, half "
                f"the layers, {quality(TRANSLATED_15_R14, 'linear')}, "
                f"{difference(TRANSLATED_15, TRANSLATED_15_R14 + ':linear', 'linear')} over translated throughout but "
                f"still {difference(TRANSLATED_15, TRANSLATED_15_R14 + ':linear', 'select@chunks')} against select",
        lambda: f"`select@chunks` gave the same answer on {same_across(TRANSLATED_15, JOINED, 'select@chunks')}",
        lambda: f"**Joined as translated**: {quality(TRANSLATED_15, 'linear')} F1 against select's "
                f"{quality(TRANSLATED_15, 'select@chunks')}, {difference(TRANSLATED_15, 'linear', 'select@chunks')}, "
                f"and no better than no context ({quality(TRANSLATED_15, 'none')}): it closes "
                f"{gap(TRANSLATED_15, 'linear', 'select@chunks', JOINED + ':native')} of native's lead over select",
        lambda: f"(`linear+deviation`, 15% recomputed): {quality(TRANSLATED_15, 'linear+deviation')}, "
                f"{difference(TRANSLATED_15, 'linear+deviation', 'select@chunks')} against select, "
                f"{gap(TRANSLATED_15, 'linear+deviation', 'select@chunks', JOINED + ':native')} of native's lead",
        lambda: f"{same_answers(DOC_GEMMA, 'stored', 'native')} questions with gemma, "
                f"{same_answers(DOC_QWEN, 'stored', 'native')} with qwen and "
                f"{same_answers(DOC_QWEN_15_NATIVE, 'stored', 'native')} with qwen-1.5b",
        lambda: f"({ratio(DOC_GEMMA, 'stored', 'native')}, {ratio(DOC_QWEN, 'stored', 'native')} and "
                f"{ratio(DOC_QWEN_15_NATIVE, 'stored', 'native')} of it)",
        lambda: f"(select − stored: {difference(DOC_GEMMA, 'select@chunks', 'stored', 'commas')})",
        lambda: f"stored {quality(DOC_GEMMA_MORE, 'stored')} F1 against select's {quality(DOC_GEMMA_MORE, 'select@chunks')}, "
                f"{difference(DOC_GEMMA_MORE, 'stored', 'select@chunks')}",
        lambda: f"qwen-1.5b's own caches scored {quality(JOINED, 'stored')} F1 against select's "
                f"{quality(JOINED, 'select@chunks')}, {difference(JOINED, 'stored', 'select@chunks')}, and answered at "
                f"{ratio(JOINED, 'stored', 'select@chunks')} of select's first-token time",
        lambda: f"four paragraphs together scored {quality(JOINED, 'native')} (stored − native "
                f"{difference(JOINED, 'stored', 'native', 'commas')}), with stored's first token at "
                f"{ratio(JOINED, 'stored', 'native')} of native's: the join keeps "
                f"{gap(JOINED, 'stored', 'select@chunks', 'native')} of native's lead over select",
        lambda: f"(CacheBlend's rule) {quality(JOINS, 'stored+deviation')}, "
                f"{difference(JOINS, 'stored+deviation', 'select@chunks')} against select, and "
                f"{difference(JOINED, JOINS + ':stored+deviation', 'stored')} against the join as stored; at the start "
                f"of each document (EPIC's rule) {quality(JOINS, 'stored+initial')}; by the question's sentences "
                f"{quality(JOINS, 'stored+question')}",
        lambda: f"{quality(BLEND30.split(':')[0], 'stored+deviation')} F1 against native's {quality(JOINED, 'native')} "
                f"(repair − native {difference(JOINED, BLEND30, 'native', 'commas')}), "
                f"{difference(JOINED, BLEND30, 'select@chunks')} against select, {difference(JOINED, BLEND30, 'stored')} "
                f"against the join as stored and {difference(JOINS, BLEND30, 'stored+deviation')} against 15% "
                f"recomputed: it keeps {gap(JOINED, BLEND30, 'select@chunks', 'native')} of native's lead",
        lambda: f"{quality(TRANSLATED_BLEND30.split(':')[0], 'linear+deviation')}, "
                f"{difference(TRANSLATED_15, TRANSLATED_BLEND30, 'select@chunks')} against select and "
                f"{difference(TRANSLATED_15, TRANSLATED_BLEND30, 'linear+deviation')} over 15% recomputed, closing "
                f"{gap(TRANSLATED_15, TRANSLATED_BLEND30, 'select@chunks', JOINED + ':native')} of native's lead",
        lambda: f"at 20% (`-blend20`, the same questions) {quality(BLEND20.split(':')[0], 'stored+deviation')}, native "
                f"{difference(JOINED, BLEND20, 'native')}, keeping "
                f"{gap(JOINED, BLEND20, 'select@chunks', 'native')} of the lead",
        lambda: f"scored {quality(QWEN_BLEND30.split(':')[0], 'stored+deviation')}: native "
                f"{difference(JOINED_QWEN, QWEN_BLEND30, 'native')}, select "
                f"{difference(JOINED_QWEN, QWEN_BLEND30, 'select@chunks')}, the join as stored "
                f"{difference(JOINED_QWEN, QWEN_BLEND30, 'stored')}, keeping "
                f"{gap(JOINED_QWEN, QWEN_BLEND30, 'select@chunks', 'native')} of native's lead",
        lambda: f"three runs sharing the two cores) it took {ratio(BLEND30_TIME, 'stored+deviation', 'native')} of "
                f"native's, and 20% recomputed, timed the same way in another run (`-blend20-time`), "
                f"{ratio(BLEND20_TIME, 'stored+deviation', 'native')}",
        lambda: f"As stored (a = 1) it was native's first token on {join_temperature(1.0)}; a = 0.95, "
                f"{join_temperature(0.95)[:-1].replace('mean KL ', '')}); a = 1.05, "
                f"{join_temperature(1.05)[:-1].replace('mean KL ', '')})",
        lambda: f"the join as stored answered at {ratio(JOINS_TIME, 'stored', 'native')} of native's first token and the "
                f"repairs at {ratio(JOINS_TIME, 'stored+question', 'native')} (question), "
                f"{ratio(JOINS_TIME, 'stored+deviation', 'native')} (deviation) and "
                f"{ratio(JOINS_TIME, 'stored+initial', 'native')} (initial)",
        lambda: f"stored {quality(STORIES, 'stored')} accuracy, select {quality(STORIES, 'select@chunks')}, no context "
                f"{quality(STORIES, 'none')}",
        lambda: f"(stored − select {difference(STORIES, 'stored', 'select@chunks', 'commas')})",
        lambda: f"scored {quality(STORIES_15, 'native@chunks')}, as select did "
                f"({difference(STORIES_15, 'native@chunks', 'select@chunks', 'commas')}); stored − native@chunks "
                f"{difference(STORIES_15, 'stored', 'native@chunks')}, stored answering at "
                f"{ratio(STORIES_15, 'stored', 'native@chunks')} of its first-token time",
        lambda: f"stored {quality(STORIES_15, 'stored')} accuracy, select {quality(STORIES_15, 'select@chunks')}, no context "
                f"{quality(STORIES_15, 'none')} (stored − select {difference(STORIES_15, 'stored', 'select@chunks', 'commas')}; "
                f"select − no context {difference(STORIES_15, 'select@chunks', 'none', 'commas')}). Stored answered at "
                f"{ratio(STORIES_15, 'stored', 'select@chunks')} of select's first-token time",
        lambda: f"stored {quality(STORIES_GEMMA, 'stored')} accuracy, select {quality(STORIES_GEMMA, 'select@chunks')}, "
                f"native over the top-4 chunks (`native@chunks`) {quality(STORIES_GEMMA, 'native@chunks')}, no context "
                f"{quality(STORIES_GEMMA, 'none')} (stored − select "
                f"{difference(STORIES_GEMMA, 'stored', 'select@chunks', 'commas')})",
        lambda: f"top-4 chunks scored {quality(DOC_QWEN_MORE, 'native@chunks')}: below select "
                f"({difference(DOC_QWEN_MORE, 'native@chunks', 'select@chunks', 'commas')}) and above the whole article "
                f"from the store (stored − native@chunks {difference(DOC_QWEN_MORE, 'stored', 'native@chunks', 'commas')}), "
                f"at {times(DOC_QWEN_MORE, 'native@chunks', 'select@chunks')} times select's first-token time",
        lambda: f"scored {quality(DOC_GEMMA_MORE, 'native@chunks')}: within noise of select "
                f"({difference(DOC_GEMMA_MORE, 'native@chunks', 'select@chunks', 'commas')}) and above the whole article from "
                f"the store (stored − native@chunks {difference(DOC_GEMMA_MORE, 'stored', 'native@chunks', 'commas')}), at "
                f"{times(DOC_GEMMA_MORE, 'native@chunks', 'select@chunks')} times select's first-token time",
        lambda: f"native over the top-4 chunks (`native@chunks`, added later over the same questions) "
                f"{quality(STORIES, 'native@chunks')} as well (stored − native@chunks "
                f"{difference(STORIES, 'stored', 'native@chunks', 'commas')})",
        lambda: f"gemma {quality(JOINED_GEMMA, 'native@chunks')} (against native "
                f"{difference(JOINED_GEMMA, 'native@chunks', 'native', 'commas')}), qwen "
                f"{quality(JOINED_QWEN, 'native@chunks')} ({difference(JOINED_QWEN, 'native@chunks', 'native', 'commas')}), qwen-1.5b "
                f"{quality(JOINED, 'native@chunks')} over its 100 questions "
                f"({difference(JOINED, 'native@chunks', 'native', 'commas')})",
        lambda: f"it scored {quality(DOC_QWEN_15, 'native@chunks')}: within noise of select "
                f"({difference(DOC_QWEN_15, 'native@chunks', 'select@chunks', 'commas')}) and above the whole article from "
                f"the store (stored − native@chunks {difference(DOC_QWEN_15, 'stored', 'native@chunks', 'commas')}), at "
                f"{times(DOC_QWEN_15, 'native@chunks', 'select@chunks')} times select's first-token time",
        lambda: f"stored gave native's answer on {same_answers(STORIES_GEMMA, 'stored', 'native')} at "
                f"{ratio(STORIES_GEMMA, 'stored', 'native')} of its first-token time",
        lambda: f"stored gave native's answer on {same_answers(STORIES_NATIVE, 'stored', 'native')} at "
                f"{ratio(STORIES_NATIVE, 'stored', 'native')} of its first-token time",
        lambda: f"native {quality(JOINED_GEMMA, 'native')}, the join as stored {quality(JOINED_GEMMA, 'stored')} (stored − "
                f"native {difference(JOINED_GEMMA, 'stored', 'native', 'commas')}), select {quality(JOINED_GEMMA, 'select@chunks')}, "
                f"no context {quality(JOINED_GEMMA, 'none')}. Native leads select beyond noise "
                f"({difference(JOINED_GEMMA, 'native', 'select@chunks', 'commas')}) and the join by a hair less (stored − "
                f"select {difference(JOINED_GEMMA, 'stored', 'select@chunks', 'commas')}); the join keeps "
                f"{gap(JOINED_GEMMA, 'stored', 'select@chunks', 'native')} of native's lead, at "
                f"{ratio(JOINED_GEMMA, 'stored', 'native')} of native's first-token time and "
                f"{ratio(JOINED_GEMMA, 'stored', 'select@chunks')} of select's",
        lambda: f"whole SQuAD articles from its store scored {quality(DOC_GEMMA_MORE, 'stored')} against select's "
                f"{quality(DOC_GEMMA_MORE, 'select@chunks')} ({difference(DOC_GEMMA_MORE, 'stored', 'select@chunks', 'commas')})",
        lambda: f"the deviation's {quality(JOINS, 'stored+deviation')} is native "
                f"{difference(JOINED, JOINS + ':stored+deviation', 'native')}",
        lambda: f"{quality(DOC_TRANSLATED, 'stored')} F1 against select's {quality(DOC_TRANSLATED, 'select@chunks')} "
                f"({difference(DOC_TRANSLATED, 'stored', 'select@chunks', 'commas')}) and no context's "
                f"{quality(DOC_TRANSLATED, 'none')}, its first token {times(DOC_TRANSLATED, 'stored', 'select@chunks')} "
                f"times select's",
        lambda: f"(native − select {difference(DOC_TRANSLATED, DOC_GEMMA + ':native', 'select@chunks', 'commas')}, "
                f"across the two files)",
        lambda: f"{quality(DOC_TRANSLATED_QWEN, 'stored')} F1 against select's {quality(DOC_TRANSLATED_QWEN, 'select@chunks')} "
                f"({difference(DOC_TRANSLATED_QWEN, 'stored', 'select@chunks', 'commas')}) and no context's "
                f"{quality(DOC_TRANSLATED_QWEN, 'none')}, its first token {times(DOC_TRANSLATED_QWEN, 'stored', 'select@chunks')} "
                f"times select's, of which translating the 5.6k-token article was most (a median of "
                f"{_median_seconds(DOC_TRANSLATED_QWEN, 'stored', 'translate_ms_median'):.1f} s)",
        lambda: f"{quality(DOC_TRANSLATED_15, 'linear')} F1 against select's {quality(DOC_TRANSLATED_15, 'select@chunks')} "
                f"({difference(DOC_TRANSLATED_15, 'linear', 'select@chunks', 'commas')}) and no context's "
                f"{quality(DOC_TRANSLATED_15, 'none')}, its first token {times(DOC_TRANSLATED_15, 'linear', 'select@chunks')} "
                f"times select's, translation a median of "
                f"{_median_seconds(DOC_TRANSLATED_15, 'linear', 'translate_ms_median'):.1f} s of it",
        lambda: f"near no context for every target ({difference(DOC_TRANSLATED_QWEN, 'stored', 'none', 'commas')}, over "
                f"it for qwen; within noise of it for gemma and qwen-1.5b)" if all(
                    _rows(f, m, "none")[1]["difference"]["low"] <= 0 <= _rows(f, m, "none")[1]["difference"]["high"]
                    for f, m in ((DOC_TRANSLATED, "stored"), (DOC_TRANSLATED_15, "linear"))) else "not within noise",
        lambda: (lambda h: f"recovered {h['recovery']['translated']:.2f} of native's next-text loss and "
                           f"{h['recall']['recovery']['translated']:.2f} of its recall, about what qwen-1.5b gets by prefilling "
                           f"its bottom 2 layers")(json.loads((RESULTS / "designs/smollm2__qwen-1.5b-linear-1k.card.json")
                                                      .read_text())["heldout"]),
        lambda: f"(native − select {difference(DOC_TRANSLATED_QWEN, DOC_QWEN + ':native', 'select@chunks', 'commas')}, "
                f"across the two files, whose `select@chunks` gave the same "
                f"{same_across(DOC_TRANSLATED_QWEN, DOC_QWEN, 'select@chunks').split(' of ')[0]} answers)",
        lambda: f"with qwen it scored {quality(DOC_FOCUS, 'focus')} F1 against select's "
                f"{quality(DOC_FOCUS, 'select@chunks')} over 27 questions, {difference(DOC_FOCUS, 'focus', 'select@chunks')}",
        lambda: f"with qwen-1.5b {quality(DOC_FOCUS_15, 'focus')} against {quality(DOC_FOCUS_15, 'select@chunks')} over "
                f"30, {difference(DOC_FOCUS_15, 'focus', 'select@chunks')}, its first token "
                f"{times(DOC_FOCUS_15, 'focus', 'select@chunks')} times select's",
        lambda: f"{quality(DOC_QWEN, 'native')} F1 for the whole article against {quality(DOC_QWEN, 'native@chunks')} "
                f"for the top-4 chunks ({difference(DOC_QWEN, 'native', 'native@chunks', 'commas')})",
        lambda: f"the document-cached chunks placed apart with the default repair (`stored@chunks`) scored "
                f"{quality(DOC_QWEN_MORE, 'stored@chunks')}, {difference(DOC_QWEN_MORE, 'stored@chunks', 'select@chunks')}",
        lambda: f"stored answered at {ratio(DOC_QWEN_15, 'stored', 'select@chunks')} of select's first-token time with "
                f"qwen-1.5b and {ratio(DOC_QWEN_MORE, 'stored', 'select@chunks')} with qwen",
    ],
    "docs/speed.md": [
        lambda: f"stored {bench_ratio('bench-qwen-1.5b-4k.json', 4091, 'stored')} of native's first token "
                f"({bench_seconds('bench-qwen-1.5b-4k.json', 4091, 'stored')} s against "
                f"{bench_seconds('bench-qwen-1.5b-4k.json', 4091, 'native')} s), "
                f"`torch.save` {bench_ratio('bench-qwen-1.5b-4k.json', 4091, 'torch_save')}, select "
                f"{bench_ratio('bench-qwen-1.5b-4k.json', 4091, 'select', 3)}, with native's first token"
                if bench_same("bench-qwen-1.5b-4k.json", 4091) else "not native's",
        lambda: (lambda rs: f"{min(x['load_ms'] for x in rs):.0f} to {max(x['load_ms'] for x in rs):.0f} ms and its placing "
                            f"{min(x['place_ms'] for x in rs):.0f} to {max(x['place_ms'] for x in rs):.0f} ms, "
                            f"{min((x['load_ms'] + x['place_ms']) / x['ttft_ms'] for x in rs):.1%} to "
                            f"{max((x['load_ms'] + x['place_ms']) / x['ttft_ms'] for x in rs):.1%} of its first token")(
            [x["stored"] for x in _bench_row("bench-qwen-1.5b-4k.json", 4091)["rounds"] if not x["warm_up"]]),
        lambda: f"stored {bench_ratio('bench-gemma-16k.json', 16385, 'stored')} of native's first token "
                f"({bench_seconds('bench-gemma-16k.json', 16385, 'stored')} s against "
                f"{bench_seconds('bench-gemma-16k.json', 16385, 'native')} s; load "
                f"{bench_part('bench-gemma-16k.json', 16385, 'load')}, place "
                f"{bench_part('bench-gemma-16k.json', 16385, 'place')}), "
                f"`torch.save` {bench_ratio('bench-gemma-16k.json', 16385, 'torch_save')} and select "
                f"{bench_ratio('bench-gemma-16k.json', 16385, 'select', 3)}, with native's first token"
                if bench_same("bench-gemma-16k.json", 16385) else "not native's first token",
        lambda: f"At 8,207 tokens the stored first token took {bench_ratio(TTFT_15, 8207, 'stored')} of "
                f"native prefill's ({bench_seconds(TTFT_15, 8207, 'stored')} s against "
                f"{bench_seconds(TTFT_15, 8207, 'native')} s) and `torch.save`'s "
                f"{bench_ratio(TTFT_15, 8207, 'torch_save')}; at 16,393 tokens "
                f"{bench_ratio(TTFT_15, 16393, 'stored')} ({bench_seconds(TTFT_15, 16393, 'stored')} s "
                f"against {bench_seconds(TTFT_15, 16393, 'native', ',.2f')} s, 28 minutes of native "
                f"prefill), `torch.save`'s {bench_ratio(TTFT_15, 16393, 'torch_save')} and select's "
                f"{bench_ratio(TTFT_15, 16393, 'select', 3)}, from {bench_megabytes(TTFT_15, 16393)} of KV "
                f"against {bench_megabytes(TTFT_15, 16393, of='torch_save')}",
        lambda: f"load {bench_part(TTFT_15, 16393, 'load')}, place {bench_part(TTFT_15, 16393, 'place')}",
        lambda: f"stored {bench_ratio('bench-qwen-xxh3.json', 4091, 'stored')} of native's first token and `torch.save` "
                f"{bench_ratio('bench-qwen-xxh3.json', 4091, 'torch_save')}, with native's first token, from "
                f"{bench_megabytes('bench-qwen-xxh3.json', 4091)} against "
                f"{bench_megabytes('bench-qwen-xxh3.json', 4091, of='torch_save')}",
        lambda: (lambda rows: "at " + ", at ".join(
            f"{r['context_tokens']:,}{' context tokens' if i == 0 else ''} {r['median_s']['enable_gqa']:.2f} s against {r['median_s']['repeat_kv']:.2f} s "
            f"({r['ratio']:.3f}x)" for i, r in enumerate(rows)) if all(r["max_logit_difference"] == 0 for r in rows) else "logits differ")(
            json.loads((RESULTS / "gqa-prefill-qwen-1.5b.json").read_text())["rows"]),
        lambda: (lambda rows: "; ".join(
            f"{r['context_tokens']:,}{' context tokens' if i == 0 else ''} with {r['share']:.0%} recomputed "
            f"{r['median_s']['enable_gqa']:.2f} s against {r['median_s']['repeat_kv']:.2f} s ({r['ratio']:.3f}x)"
            for i, r in enumerate(rows)) + ", the same repaired KV to the bit"
            if all(r["max_kv_difference"] == 0 for r in rows) else "the KV differs")(
            json.loads((RESULTS / "repair-attention-qwen-1.5b.json").read_text())["rows"]),
        lambda: (lambda d: f"the first question took {d['first']['ttft_ms'] / 1e3:.2f} s to its first token (load "
                           f"{d['first']['load_ms']:.0f} ms, place {d['first']['place_ms']:.0f} ms, the question's prefill "
                           f"{d['first']['prefill_ms']:,.0f} ms); the three repeated ones "
                           f"{min(r['ttft_ms'] for r in d['repeated']) / 1e3:.2f} to "
                           f"{max(r['ttft_ms'] for r in d['repeated']) / 1e3:.2f} s, median {d['repeated_over_first']:.2f}x "
                           f"the first, with load and place "
                           f"{max(max(r['load_ms'], r['place_ms']) for r in d['repeated']):.1f} ms each")(
            json.loads((RESULTS / "serve-warm-qwen.json").read_text())["documents"]),
        lambda: f"tokens the int8 store's first token took {bench_ratio('bench-qwen-1.5b-int8.json', 4091, 'stored')} of "
                f"native prefill's (the issue's goal: at most 0.03) and the `torch.save` baseline's "
                f"{bench_ratio('bench-qwen-1.5b-int8.json', 4091, 'torch_save')}",
        lambda: f"the document's KV took {bench_megabytes('bench-qwen-1.5b-int8.json', 4091)} on disk",
        lambda: f"stored first token took {bench_ratio('bench-qwen-1.5b-int8-place.json', 4091, 'stored')} of native's and "
                f"`torch.save`'s {bench_ratio('bench-qwen-1.5b-int8-place.json', 4091, 'torch_save')}, with native's first "
                f"token; its measured round was load {bench_part('bench-qwen-1.5b-int8-place.json', 4091, 'load')}, place "
                f"{bench_part('bench-qwen-1.5b-int8-place.json', 4091, 'place')} and the question's prefill "
                f"{bench_part('bench-qwen-1.5b-int8-place.json', 4091, 'prefill')}, so load plus place was "
                f"{load_share('bench-qwen-1.5b-int8-place.json', 4091)} of it" if bench_same('bench-qwen-1.5b-int8-place.json', 4091) else "not native's first token",
        lambda: f"There the stored first token took {bench_ratio('bench-gemma.json', 16385, 'stored')} of native "
                f"prefill's (1.87 s against 472.86 s) and `torch.save`'s {bench_ratio('bench-gemma.json', 16385, 'torch_save')} "
                f"(1.54 s), with native's first token, from {bench_megabytes('bench-gemma.json', 16385)} of KV against "
                f"604.2 MB; select answered sooner than both ({bench_ratio('bench-gemma.json', 16385, 'select')}), "
                f"from the question's sentences alone. Stored was later than `torch.save` there because placing the 16k "
                f"tokens took {bench_part('bench-gemma.json', 16385, 'place')} of its 1.87 s",
        lambda: f"load {bench_part('bench-qwen-1.5b-int8.json', 4091, 'load')}, place "
                f"{bench_part('bench-qwen-1.5b-int8.json', 4091, 'place')} and the question's prefill "
                f"{bench_part('bench-qwen-1.5b-int8.json', 4091, 'prefill')}",
        *[lambda page=page: (lambda r: f"{r['ms_median']['place_chunks']} ms against {r['ms_median']['plain']} ms "
                                       f"({r['ratio']}x), the same cache" if r["same_cache"] else "not the same cache")(
            json.loads((RESULTS / page).read_text())) for page in ("place-chunks-qwen-1.5b.json", "place-chunks-gemma.json")],
        lambda: f"int8 took {bytes_per_token('qwen-1.5b-hotpot-int8')} KV bytes a token against "
                f"{bytes_per_token('qwen-1.5b-hotpot')} (0.54x) and gave float16's answer on "
                f"{same_across(JOINED_INT8, JOINED, 'stored')} questions (int8 − float16 "
                f"{difference(JOINED, JOINED_INT8 + ':stored', 'stored', 'commas')}); int4 took "
                f"{bytes_per_token('qwen-1.5b-hotpot-int4')} (0.29x), "
                f"{difference(JOINED, JOINED_INT4 + ':stored', 'stored', 'commas')}, the same answer on "
                f"{same_across(JOINED_INT4, JOINED, 'stored')}",
        lambda: f"4,091 tokens the int8 store's first token took {bench_ratio('bench-qwen-int8.json', 4091, 'stored')} of "
                f"native prefill's and the `torch.save` baseline's {bench_ratio('bench-qwen-int8.json', 4091, 'torch_save')}",
        lambda: f"gave {bench_ratio('bench-qwen.json', 4091, 'stored')} and {bench_ratio('bench-qwen.json', 4091, 'torch_save')}",
        lambda: f"the document's KV took {bench_megabytes('bench-qwen-int8.json', 4091)} on disk against "
                f"{bench_megabytes('bench-qwen.json', 4091)}",
        lambda: f"{bytes_per_token('qwen-int4')} KV bytes a token on disk against {bytes_per_token('qwen')} for float16",
        lambda: f"{bytes_per_token('qwen-int4r')} KV bytes a token against {bytes_per_token('qwen')} "
                f"({_bytes('qwen-int4r') / _bytes('qwen'):.3f}x); over the 200 questions `stored` scored "
                f"{quality(DOC_QWEN_INT4R, 'stored')} F1, int4 − float16 "
                f"{difference(DOC_QWEN_MORE, DOC_QWEN_INT4R + ':stored', 'stored', 'commas')}, and gave float16's answer "
                f"word for word on {same_across(DOC_QWEN_INT4R, DOC_QWEN_MORE, 'stored')}, where int4 before the "
                f"refinement kept {same_across(DOC_QWEN_INT4, DOC_QWEN_MORE, 'stored').split()[0]}",
        lambda: f"{bytes_per_token('qwen-1.5b-hotpot-int4r')} KV bytes a token against "
                f"{bytes_per_token('qwen-1.5b-hotpot-100')} "
                f"({_bytes('qwen-1.5b-hotpot-int4r') / _bytes('qwen-1.5b-hotpot-100'):.3f}x), int4 − float16 "
                f"{difference(JOINED, HOTPOT_15_INT4R + ':stored', 'stored', 'commas')}, the same answer on "
                f"{same_across(HOTPOT_15_INT4R, JOINED, 'stored')}",
        lambda: f"`stored` scored {quality(DOC_QWEN_INT4, 'stored')} F1 against float16's "
                f"{quality(DOC_QWEN_MORE, 'stored')}, int4 − float16 "
                f"{difference(DOC_QWEN_MORE, DOC_QWEN_INT4 + ':stored', 'stored', 'commas')}, and gave float16's "
                f"answer word for word on {same_across(DOC_QWEN_INT4, DOC_QWEN_MORE, 'stored')}",
        lambda: f"{bytes_per_token('qwen-int8')} KV bytes a token (0.54x float16); `stored` scored "
                f"{quality(DOC_QWEN_INT8, 'stored')}, int8 − float16 "
                f"{difference(DOC_QWEN_MORE, DOC_QWEN_INT8 + ':stored', 'stored', 'commas')}, and gave float16's answer "
                f"on {same_across(DOC_QWEN_INT8, DOC_QWEN_MORE, 'stored')}",
        lambda: f"{bytes_per_token('qwen-1.5b-int8')} KV bytes a token against {bytes_per_token('qwen-1.5b')} (0.53x); "
                f"`stored` scored {quality(DOC_QWEN_15_INT8, 'stored')} F1 against float16's {quality(DOC_QWEN_15, 'stored')}, "
                f"int8 − float16 {difference(DOC_QWEN_15, DOC_QWEN_15_INT8 + ':stored', 'stored', 'commas')}, and gave "
                f"float16's answer on {same_across(DOC_QWEN_15_INT8, DOC_QWEN_15, 'stored')}",
        lambda: f"float16 took {load_place('load-place-qwen-1.5b.json', 'qwen-1.5b')} from its SQLite store and "
                f"{load_place('load-place-qwen-1.5b.json', '-lance16')} from a LanceDB copy, int8 "
                f"{load_place('load-place-qwen-1.5b.json', '-int8')} (a LanceDB copy) and int4 "
                f"{load_place('load-place-qwen-1.5b.json', '-int4')}",
        lambda: "int4 as it was " + int4_variant('int4').replace(") ", ") gave float16's answer on ") + "; float16 keys "
                f"with int4 values {int4_variant('int4-values')}, int4 keys with float16 values "
                f"{int4_variant('int4-keys')}: the keys lose the answers. Within 0.30x: keys in groups of 32 tokens "
                f"{int4_variant('keys-g32')}; the 1% of key values farthest from their group's mean kept in float16 "
                f"{int4_variant('outliers-10')}; int8 keys in the two layers whose int4 keys err most "
                f"{int4_variant('refine-2')}, in four {int4_variant('refine-4')}. int8 keys everywhere "
                f"{int4_variant('keys-int8')}",
        lambda: f"placing took {cold_ask('ask, prefix read', 'place_ms')} against "
                f"{cold_ask('ask, prefix prefilled', 'place_ms')} prefilled, and the first token "
                f"{cold_ask('ask, prefix read', 'ttft_ms')} against {cold_ask('ask, prefix prefilled', 'ttft_ms')}, "
                f"with the same answer" if _cold_ask()["same_answer"]
                else "not the same answer",
        lambda: f"(least cosine {_cold_ask()['embedder_least_cosine']:.7f})",
        lambda: f"{cold_ask('embedder, cagkit', 'ms')} against {cold_ask('embedder, sentence-transformers', 'ms')} "
                f"through sentence-transformers",
        lambda: f"load {load_place_read(MMAP, 'mmap', 'load')} memory-mapped against "
                f"{load_place_read(MMAP, 'copy', 'load')} copied, load and place together "
                f"{load_place_read(MMAP, 'mmap', 'load_place')} against {load_place_read(MMAP, 'copy', 'load_place')}",
        lambda: f"all three SQLite stores, {load_place('load-place-qwen.json', '-qwen')[:-3]}, "
                f"{load_place('load-place-qwen.json', '-int8')[:-3]} and {load_place('load-place-qwen.json', '-int4')}",
        lambda: f"{bytes_per_token('qwen-1.5b-int4')} bytes a token against {bytes_per_token('qwen-1.5b')} (0.28x); "
                f"over the first 30 questions {difference(DOC_QWEN_15, DOC_QWEN_15_INT4 + ':stored', 'stored', 'commas')}, "
                f"the same answer on {same_across(DOC_QWEN_15_INT4, DOC_QWEN_15, 'stored')}",
    ],
    "docs/translators.md": [
        lambda: f"it recovers {card('qwen__qwen-1.5b-mot-1k', 'recovery', 'translated')} of the loss gap on next "
                f"text (the ridge {card('qwen__qwen-1.5b-linear-1k-refit', 'recovery', 'translated')}) and "
                f"{card('qwen__qwen-1.5b-mot-1k', 'recall', 'kl_recovery', 'translated')} of the KL gap on recall "
                f"(the ridge {card('qwen__qwen-1.5b-linear-1k-refit', 'recall', 'kl_recovery', 'translated')}), where "
                f"qwen-1.5b with its bottom 14 layers its own and the rest from the ridge reaches "
                f"{card('qwen__qwen-1.5b-linear-1k-refit', 'recall', 'kl_recovery', 'native_bottom_14')}",
        lambda: f"HotpotQA at document scope {quality(TRANSLATED_MOT, 'mot-placed')} F1 placed as translated (the "
                f"ridge {quality(TRANSLATED_15, 'linear')}, select {quality(TRANSLATED_15, 'select@chunks')}) and "
                f"{quality(TRANSLATED_MOT, 'mot+question')} with 30% of the sentences recomputed",
        lambda: f"QuALITY {quality(STORIES_TRANSLATED_MOT.split(':')[0], 'mot')}, as the ridge",
        lambda: f"{quality(DESIGN_ONE_CHUNK_15, 'oracle')} F1 against {quality(DESIGN_ONE_CHUNK_15, 'none')} (the first "
                f"200 SQuAD v2 questions, top-1)",
        lambda: f"its chunk placed as translated scores {quality(DESIGN_ONE_CHUNK_15, 'mot-placed')}, "
                f"{difference(DESIGN_ONE_CHUNK_15, 'mot-placed', 'none')} over none",
        lambda: f"it scores {quality(DESIGN_HOTPOT_15, 'mot')} against select's {quality(DESIGN_HOTPOT_15, 'select')}, "
                f"{difference(DESIGN_HOTPOT_15, 'mot', 'select')} over the first",
        lambda: f"a median of {seconds(DESIGN_HOTPOT_15, 'mot')} s against select's {seconds(HOTPOT_QWEN_15, 'select')} s",
    ],
}


@pytest.mark.parametrize("document, sentence", [(d, s) for d, sentences in SENTENCES.items() for s in sentences])
def test_a_typed_figure_matches_its_results_file(document, sentence):
    text = re.sub(r"\s+", " ", (ROOT / document).read_text())  # sentences wrap across lines
    expected = sentence()
    assert expected in text, f"{document} should say '{expected}' (from docs/results); rewrite its sentence"
