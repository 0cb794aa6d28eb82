"""Benchmark report: markdown tables and PNG charts from `cagkit eval` results files.

Results JSON contract (one file per dataset and source -> target pair, written by `cagkit eval`):

    {"dataset": "squad_v2/dev-v2.0.part-a.json",   # path as given to --data
     "format": "squad",                              # a cagkit.evaluation.datasets format
     "source": "smollm2", "target": "gemma",         # model names
     "settings": {"top_k": 4, "full_context": false, "limit": 50,
                  "max_new_tokens": 24, "chunk_tokens": 256},
     "command": "cagkit eval --data ...",            # the exact command, to reproduce the file
     "device": "cpu",                                # where the models ran (files before 2026-11-30: absent)
     "methods": {"native": {...}, "none": {...}, "select": {...}, "source": {...},
                 "linear": {...}, "projector": {...}, "mot": {...}, "oracle": {...}}}

Each method (any may be missing) maps to:

    free-form:  "f1", "exact_match"     mean over examples, 0..1
    closed-set: "accuracy"              mean over examples, 0..1 (instead of f1/exact_match)
    "recovery"             quality / native's quality; null when native is missing
    "ttft_ms_median"       median time to first token, milliseconds
    "translate_ms_median"  median time to make the placed cache, milliseconds: translation plus the repair
                           (recomputed bottom layers, blend); 0 for native, the repair alone for the source
    "repair_ms_median"     median time of the repair alone (part of the above); null in files written before
                           it was recorded (2026-12-02)
    "kv_bytes_per_token"   bytes of KV cache stored per context token
    "n"                    number of examples scored
    "translator"           linear/projector/mot with another target: sha256[:16] of the checkpoint used; a
                           resumed run answers again every question of a method whose checkpoint changed
    "examples"             [{"id", "prediction", "ttft_ms", "f1", "exact_match"} or
                            {"id", "prediction", "ttft_ms", "correct": bool}]

Any number may be null (shown as a dash). The paired intervals read "examples"; the rest of the tables do not.

The summary is the paper's table: one row per results file, one table per metric family (closed-set accuracy,
F1), with MoT's recovery against native, its ratio to the strongest single-path baseline (the better of linear
and projector in that file), and two paired bootstrap intervals over the questions both methods answered: MoT −
that baseline, and native − none (whether the context is worth anything to the target on that set at all).

`select` is the control a method that reads stored KV has to beat: the target prefills natively only the
question's sentences of the retrieved chunks, the ones the repair would recompute, and reads no stored KV. When a
run has it, the summary adds a table of every method's paired difference against it, and the run's own table a
column of the same.
"""

import json
import os
import re
import shlex
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from cagkit.config import DEFAULT_CHUNK_TOKENS, DEFAULT_TOP_K, Placement
from cagkit.errors import CagkitError
from cagkit.evaluation.metrics import gap_closed_bootstrap, paired_bootstrap

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# the order a table reads in: the controls that read no stored KV, then the methods that do, then the diagnostic
METHOD_ORDER = ("native", "none", "select", "source", "linear", "projector", "mot", "mot-placed", "oracle")
CONTROL = "select"  # every method's paired difference is taken against it
_REQUIRED_KEYS = ("dataset", "source", "target", "command", "methods")
_BAR_CHART = "quality_by_method.png"
_SCATTER = "quality_vs_ttft.png"
_MARKERS = "osD^vPX*"
_DASH = "—"
SINGLE_PATH = ("linear", "projector")  # the single-path baselines MoT is compared against


def write_report(result_paths: list[Path], out_md: Path, plots_dir: Path, note: str | None = None) -> None:
    """Write `out_md` (one table per results file) and two PNG charts into `plots_dir`; `note`, if given, is a
    paragraph under the title (how and where the runs were made)."""
    if not result_paths:
        raise CagkitError("no results files to report on; pass the JSON files written by `cagkit eval`")
    runs = [_load_results(Path(path)) for path in result_paths]
    _require_matplotlib()
    out_md, plots_dir = Path(out_md), Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    out_md.parent.mkdir(parents=True, exist_ok=True)
    methods = _method_order(runs)
    _save(_bar_chart(runs, methods), plots_dir / _BAR_CHART)
    _save(_scatter(runs, methods), plots_dir / _SCATTER)
    lines = [
        "# cagkit eval results",
        "",
        *([note.strip(), ""] if note and note.strip() else []),
        f"![Quality per pair and method]({_relative(plots_dir / _BAR_CHART, out_md)})",
        "",
        f"![Quality against median time to first token]({_relative(plots_dir / _SCATTER, out_md)})",
        "",
    ]
    by_data = _by_data_set(runs)
    if len(by_data) > 1:  # one quality-against-first-token chart per data set, every run on it
        for name, group in by_data.items():
            path = plots_dir / f"quality_vs_ttft-{_file_slug(name)}.png"
            _save(_scatter(group, methods), path)
            lines += [f"![{name}: quality against median time to first token]({_relative(path, out_md)})", ""]
    lines += summary(runs)
    for run in runs:
        lines += _section(run)
    out_md.write_text("\n".join(lines), encoding="utf-8")


def _require_matplotlib() -> None:
    # matplotlib is an optional extra; cagkit itself runs without it.
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CagkitError(
            "the report's charts need matplotlib; install it with: pip install 'cagkit[report]'"
        ) from None


def _load_results(path: Path) -> dict:
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CagkitError(f"{path}: cannot read the results file ({error.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CagkitError(f"{path}: not a results JSON file; rerun `cagkit eval` to write it") from None
    missing = [key for key in _REQUIRED_KEYS if not isinstance(run, dict) or key not in run]
    if missing:
        raise CagkitError(f"{path}: results file lacks {', '.join(missing)}; rerun `cagkit eval` to write it")
    methods = run["methods"]
    if not isinstance(methods, dict) or not methods or not all(isinstance(m, dict) for m in methods.values()):
        raise CagkitError(
            f"{path}: 'methods' must map one or more method names to scores; rerun `cagkit eval` to write it"
        )
    return run


def _is_closed_set(run: dict) -> bool:
    return any("accuracy" in scores for scores in run["methods"].values())


def _families(runs: list[dict]) -> list[tuple[str, bool, list[dict]]]:
    """(family name, closed_set, runs) per metric family present in `runs`: accuracy first, then F1."""
    families = [("accuracy", True), ("F1", False)]
    groups = [(name, closed, [run for run in runs if _is_closed_set(run) == closed]) for name, closed in families]
    return [(name, closed, group) for name, closed, group in groups if group]


def _quality(scores: dict, closed_set: bool) -> float | None:
    return scores.get("accuracy") if closed_set else scores.get("f1")


def _method_order(runs: list[dict]) -> list[str]:
    """Known methods in their usual order, then any others as first seen."""
    seen = [name for run in runs for name in run["methods"]]
    return [m for m in METHOD_ORDER if m in seen] + list(dict.fromkeys(m for m in seen if m not in METHOD_ORDER))


def _by_data_set(runs: list[dict]) -> dict[str, list[dict]]:
    """The runs grouped by their data file's name, in the order first seen."""
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(Path(run["dataset"]).name, []).append(run)
    return groups


def _file_slug(name: str) -> str:
    """A data file's name as a file-name part: 'dev-v2.0.part-a.json' -> 'dev-v2-0-part-a'."""
    return re.sub(r"[^A-Za-z0-9]+", "-", Path(name).stem).strip("-") or "data"


def _label(run: dict) -> str:
    return f"{run['source']} → {run['target']}, {_data_label(run)}"


def _data_label(run: dict) -> str:
    """The data set and how the run gave it to the models: 'dev-v2.0.part-a.json, hybrid retrieval, blend 0.15
    by question'. Dense retrieval (every run before the others existed) goes unnamed."""
    settings = run.get("settings") or {}
    top_k = settings.get("top_k", DEFAULT_TOP_K)
    chunks = "" if settings.get("full_context") or top_k == DEFAULT_TOP_K else f", top-{top_k}"
    named = f", {mode} retrieval" if (mode := _named_retrieval(settings)) else ""
    scope = f", scope {settings['scope']}" if settings.get("scope", "chunks") != "chunks" else ""
    dtype = f", {settings['store_dtype']} KV" if settings.get("store_dtype", "float16") != "float16" else ""
    placement = Placement.from_settings(settings)
    if settings.get("blend_by_scope") and settings.get("scope") == "document":
        placement = replace(placement, blend=0.0)  # --blend left to the scope: whole documents are placed as stored
    return Path(run["dataset"]).name + chunks + named + scope + dtype + placement.describe()


def _named_retrieval(settings: dict) -> str | None:
    """A run's retrieval when a label names it: not for dense (every run before the others existed, whose
    results files do not record it) nor with the whole context, which retrieves nothing."""
    mode = settings.get("retrieval", "dense")
    return None if settings.get("full_context") or mode == "dense" else mode


def summary(runs: list[dict]) -> list[str]:
    """Markdown for the summary tables: one per metric family present in `runs` (see the module docstring)."""
    lines = ["## Summary", ""]
    for family, closed_set, group in _families(runs):
        methods = _method_order(group)
        header = ["pair", "data", "questions", *methods, "MoT / native", "MoT / best single path",
                  "MoT − best single path (95% CI)", "native − none (95% CI)"]
        lines += [f"Quality: {family}. Intervals: paired bootstrap over the questions both methods answered, "
                  "5,000 resamples. A method with \"(N q)\" has answered only N of the run's questions and is "
                  "left out of the ratios.", ""]
        lines += ["| " + " | ".join(header) + " |", "|---|---" + "|---:" * (len(header) - 2) + "|"]
        for run in group:
            scores = run["methods"]
            n = max((scores[m].get("n") or 0 for m in scores), default=0)
            # a method stopped short of the run's questions is shown with its count and left out of the ratios
            short = {m: scores[m].get("n") for m in scores if (scores[m].get("n") or 0) < n}
            quality = {m: _quality(scores[m], closed_set) for m in scores if m not in short}
            best = max((m for m in SINGLE_PATH if quality.get(m) is not None), key=lambda m: quality[m],
                       default=None)
            mot, native, baseline = quality.get("mot"), quality.get("native"), quality.get(best)
            cells = [
                f"{run['source']} → {run['target']}",
                _data_label(run),
                f"{n}" if n else _DASH,
                *[f"{_fmt(_quality(scores[m], closed_set), '.3f')} ({short[m]} q)" if m in short
                  else _fmt(quality.get(m), ".3f") for m in methods],
                _DASH if mot is None or not native else f"{mot / native:.0%}",
                _DASH if mot is None or not baseline else f"{mot / baseline:.2f}x ({best})",
                _interval(run, "mot", best, closed_set) if mot is not None else _DASH,
                _interval(run, "native", "none", closed_set) if {"native", "none"} <= quality.keys() else _DASH,
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines += _against_control(group, closed_set)
        lines += _frontier(group, closed_set)
    return lines


def _frontier(runs: list[dict], closed_set: bool) -> list[str]:
    """Markdown for one table of quality against median time to first token: a cell per method, and the methods
    no other dominates. A method dominates another when its median first token is sooner and its quality higher:
    by the point estimates, and beyond noise (the paired interval of the difference wholly above 0)."""
    methods = _method_order(runs)
    if not any(scores.get("ttft_ms_median") is not None for run in runs for scores in run["methods"].values()):
        return []
    lines = ["Quality and median time to first token (s), and the methods no other dominates (one dominates "
             "another when it answers sooner and better: by the mean, or beyond noise, its paired 95% interval "
             "wholly above 0).", ""]
    header = ["pair", "data", *methods, "not dominated", "not dominated beyond noise"]
    lines += ["| " + " | ".join(header) + " |", "|---|---" + "|---:" * len(methods) + "|---|---|"]
    for run in runs:
        scores = run["methods"]
        points = {m: (q, t / 1e3) for m in methods if m in scores
                  and (q := _quality(scores[m], closed_set)) is not None
                  and (t := scores[m].get("ttft_ms_median")) is not None}
        cells = [f"{run['source']} → {run['target']}", _data_label(run),
                 *(f"{points[m][0]:.3f} · {points[m][1]:.2f}" if m in points else _DASH for m in methods)]

        def dominated(m: str, beyond_noise: bool) -> bool:
            for other, (quality, ttft) in points.items():
                if other == m or ttft >= points[m][1]:
                    continue
                if not beyond_noise and quality > points[m][0]:
                    return True
                if beyond_noise:
                    pairs = _shared_scores(scores[other], scores[m], closed_set)
                    if pairs and paired_bootstrap([x - y for x, y in pairs])[1] > 0:
                        return True
            return False

        cells += [", ".join(m for m in points if not dominated(m, noise)) or _DASH for noise in (False, True)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _control(run: dict) -> str | None:
    """The run's `select`: the method of that name, else one that names its own scope (`select@chunks`)."""
    if CONTROL in run["methods"]:
        return CONTROL
    return next((m for m in run["methods"] if m.split("@", 1)[0] == CONTROL), None)


def _against_control(runs: list[dict], closed_set: bool) -> list[str]:
    """Markdown for one table of paired differences against `select`: a row per run that has it, a column per other
    method; nothing when no run has it."""
    runs = [run for run in runs if _control(run)]
    methods = [m for m in _method_order(runs) if m.split("@", 1)[0] != CONTROL]
    if not runs or not methods:
        return []
    lines = [f"Against `{CONTROL}` (the target prefilling only the question's sentences, no stored KV): each "
             "method − select, paired over the questions both answered, with its 95% bootstrap interval: a method beats "
             "select beyond noise only where the whole interval is above 0.", ""]
    header = ["pair", "data", f"{CONTROL}", *(f"{m} − {CONTROL}" for m in methods)]
    lines += ["| " + " | ".join(header) + " |", "|---|---" + "|---:" * (len(header) - 2) + "|"]
    for run in runs:
        control = _control(run)
        data = _data_label(run) + ("" if control == CONTROL else f" ({control})")
        cells = [f"{run['source']} → {run['target']}", data,
                 _fmt(_quality(run["methods"][control], closed_set), ".3f"),
                 *(_interval(run, m, control, closed_set) if m in run["methods"] else _DASH for m in methods)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def _interval(run: dict, a: str | None, b: str | None, closed_set: bool) -> str:
    """`a − b` over the questions both answered, with its 95% paired bootstrap interval; a dash without records."""
    found = _paired(run, a, b, closed_set)
    if found is None:
        return _DASH
    mean, low, high = found
    return f"{mean:+.3f} ({low:+.3f} to {high:+.3f})"


def _paired(run: dict, a: str | None, b: str | None, closed_set: bool) -> tuple[float, float, float] | None:
    """`paired_bootstrap` of `a − b` over the questions both answered; None where they share none."""
    pairs = _shared_scores(*(run["methods"].get(m, {}) if m else {} for m in (a, b)), closed_set)
    return paired_bootstrap([x - y for x, y in pairs]) if pairs else None


def _shared_scores(a: dict, b: dict, closed_set: bool) -> list[tuple[float, float]]:
    """Per question both methods answered (by id), their two scores: F1, or 1/0 for right/wrong."""
    first, second = (_per_question(scores, closed_set) for scores in (a, b))
    return [(score, second[i]) for i, score in first.items() if i in second]


def _per_question(scores: dict, closed_set: bool) -> dict[str, float]:
    """A method's score per question id: F1, or 1/0 for right/wrong."""
    return {r["id"]: float(r["correct"]) if closed_set else float(r["f1"]) for r in scores.get("examples") or []}


def compare(specs: list[str], gap_to: str | None = None) -> list[dict]:
    """Compare methods across results files, question by question: each `FILE[:METHOD]` (METHOD default `mot`)
    against the first. One row each: file, method, placement, questions, quality (F1, or accuracy on closed-set
    data) over its own questions, and, from the second on, its ratio to the first and the paired difference from
    the first, both over the questions the two answered, with how many of those it answered word for word as the
    first did (`same_answers`).

    With `gap_to` (`FILE[:METHOD]`, e.g. a run's `native`), each row from the second on also has `gap_closed`: the
    share of the gap from the first (e.g. `select`) to that reference which it closes, over the questions all three
    answered, with its paired bootstrap interval (None where the reference does not lead the first).

    This is how two checkpoints, recipes or placements are told apart: the paired interval covers the questions
    (not the training run), so a difference inside it is noise. Files of other data sets are refused."""
    if len(specs) < 2:
        raise CagkitError("compare needs two or more FILE[:METHOD], the first being the baseline")
    loaded = []
    for spec in specs + ([gap_to] if gap_to else []):
        path, method = _parse_spec(spec)
        run = _load_results(path)
        if method not in run["methods"]:
            raise CagkitError(f"{path}: no '{method}' results; it has {', '.join(run['methods'])} "
                              f"(name one as {path}:METHOD)")
        loaded.append((path, method, run))
    base_path, base_method, base_run = loaded[0]
    closed_set = _is_closed_set(base_run)
    base_scores = base_run["methods"][base_method]
    for path, method, run in loaded:
        if (Path(run["dataset"]).name, run.get("format")) != (Path(base_run["dataset"]).name, base_run.get("format")):
            raise CagkitError(f"{path} scores {run['dataset']} but {base_path} scores {base_run['dataset']}: "
                              f"compare runs over the same data")
    reference = None
    if gap_to:
        _, method, run = loaded.pop()
        reference = _per_question(run["methods"][method], closed_set)
    rows = []
    for path, method, run in loaded:
        scores = run["methods"][method]
        row = {"file": str(path), "method": method, "target": run["target"],
               "placement": _method_placement(run, scores, method),
               "n": scores.get("n"), "quality": _quality(scores, closed_set), "ratio": None,
               "difference": None}
        if rows:
            pairs = _shared_scores(scores, base_scores, closed_set)
            if not pairs:
                raise CagkitError(f"{path} ({method}) shares no scored question with {base_path} ({base_method}); "
                                  f"rerun `cagkit eval` over the same questions")
            mean, low, high = paired_bootstrap([x - y for x, y in pairs])
            answers = {r["id"]: r.get("prediction") for r in base_scores.get("examples") or []}
            same = sum(r.get("prediction") == answers[r["id"]] for r in scores.get("examples") or []
                       if r["id"] in answers)
            row["difference"] = {"questions": len(pairs), "mean": mean, "low": low, "high": high, "same_answers": same}
            base = sum(y for _, y in pairs) / len(pairs)
            row["ratio"] = (base + mean) / base if base else None  # over the same questions as the difference
            if reference is not None:
                row["gap_closed"] = _gap_closed(_per_question(scores, closed_set),
                                                _per_question(base_scores, closed_set), reference)
        rows.append(row)
    return rows


def _gap_cell(run: dict, method: str, control: str, closed_set: bool) -> str:
    """A method's share of the native − control gap closed, with its interval: '62% (27% to 97%)'. The caller
    gives a dash instead where native's lead over the control is inside the noise (a share of a gap that may be
    none says nothing)."""
    if method in (control, "native") or method.split("@")[0] == "native":
        return _DASH
    found = _native_gap(run, method, control, closed_set)
    return _DASH if found is None else f"{found['share']:.0%} ({found['low']:.0%} to {found['high']:.0%})"


def _native_gap(run: dict, method: str, control: str, closed_set: bool) -> dict | None:
    """`_gap_closed` of `method` from the run's `control` up to its `native`."""
    return _gap_closed(*(_per_question(run["methods"][m], closed_set) for m in (method, control, "native")))


def _gap_closed(method: dict[str, float], low: dict[str, float], high: dict[str, float]) -> dict | None:
    """The share of the gap from `low` (per question) up to `high` that `method` closes, with its interval, over
    the questions all three answered; None where `high` does not lead `low` over them."""
    shared = [i for i in method if i in low and i in high]
    found = gap_closed_bootstrap([method[i] - low[i] for i in shared],
                                 [high[i] - low[i] for i in shared]) if shared else None
    if found is None:
        return None
    share, lo, hi = found
    return {"questions": len(shared), "share": share, "low": lo, "high": hi}


def _placement_label(settings: dict) -> str:
    """How a run placed the context: 'top-4, blend 0.15 by question', 'top-1, as stored', 'whole context, ...';
    a chunk size other than the default is named: 'top-8 of 128-token chunks, ...', and so is a retrieval other
    than dense: 'top-4 by hybrid retrieval, ...'."""
    retrieval = "whole context" if settings.get("full_context") else f"top-{settings.get('top_k', '?')}"
    if settings.get("chunk_tokens", DEFAULT_CHUNK_TOKENS) != DEFAULT_CHUNK_TOKENS:
        retrieval += f" of {settings['chunk_tokens']}-token chunks"
    if mode := _named_retrieval(settings):
        retrieval += f" by {mode} retrieval"
    if settings.get("scope", "chunks") != "chunks":  # runs before --scope placed the retrieved chunks
        retrieval += {"document": ", their documents whole"}.get(settings["scope"], f", scope {settings['scope']}")
    return retrieval + (Placement.from_settings(settings).describe() or ", as stored")


def _method_placement(run: dict, scores: dict, method: str = "") -> str:
    """`_placement_label` of how one method placed the context: the run's, unless the method records its own
    (`mot-placed` never blends; a method may name its own scope, as `native@chunks`); `none` reads no context."""
    if method.split("@")[0] == "none":
        return "no context"
    own = {"scope": scores["scope"]} if scores.get("scope") else {}
    return _placement_label({**(run.get("settings") or {}), **(scores.get("placement") or {}), **own})


def _parse_spec(spec: str) -> tuple[Path, str]:
    """`FILE[:METHOD]` -> (file, method); a path that exists as given is a file with the default method."""
    if Path(spec).exists() or ":" not in spec:
        return Path(spec), "mot"
    path, method = spec.rsplit(":", 1)
    return Path(path), method


def _section(run: dict) -> list[str]:
    closed_set = _is_closed_set(run)
    quality_columns = ["accuracy"] if closed_set else ["F1", "EM"]
    control = _control(run)
    gap = bool(control) and control != "native" and "native" in run["methods"]
    # a share of native's lead is given only where that lead over the control is beyond noise
    lead = gap and (native := _paired(run, "native", control, closed_set)) is not None and native[1] > 0
    header = ["method", *quality_columns, *([f"− {control} (95% CI)"] if control else []),
              *([f"share of the native − {control} gap closed (95% CI)"] if gap else []), "recovery vs native",
              "median TTFT ms", "median translate + repair ms", "KV bytes / context token", "n"]
    lines = [f"## {_label(run)}", ""]
    if run.get("settings"):
        inert = Placement.from_settings(run["settings"]).inert_fields()
        shown = {key: value for key, value in run["settings"].items() if key not in inert}
        if run.get("device"):  # the times depend on it
            shown["device"] = run["device"]
        settings = ", ".join(f"{key}={json.dumps(value)}" for key, value in shown.items())
        lines += [f"Settings: {settings}", ""]
    lines += ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]
    for method in _method_order([run]):
        difference = [_interval(run, method, control, closed_set) if method != control else _DASH] if control else []
        if gap:
            difference.append(_gap_cell(run, method, control, closed_set) if lead else _DASH)
        lines.append("| " + " | ".join([method, *_row(run["methods"][method], closed_set, difference)]) + " |")
    return lines + ["", "Reproduce with:", "", "```", reproduce_command(run), "```", ""]


def reproduce_command(run: dict) -> str:
    """The run's recorded command, plus any placement option it left out because it was the default when the file
    was written (older files), and the store's KV dtype (which older commands left out), so that the command still
    reproduces the run under today's defaults."""
    parts = shlex.split(run["command"])
    settings = run.get("settings") or {}
    options = Placement.from_settings(settings).cli_args()
    if settings.get("store_dtype", "float16") != "float16":  # files before the command named the store's dtype
        options += ["--dtype", settings["store_dtype"]]
    missing = [arg for flag, value in zip(options[::2], options[1::2]) if flag not in parts for arg in (flag, value)]
    at = parts.index("--out") if "--out" in parts else len(parts)
    return shlex.join(parts[:at] + missing + parts[at:])


def _row(scores: dict, closed_set: bool, difference: list[str]) -> list[str]:
    """A method's cells in its run's table; `difference` is its cell against `select`, or nothing."""
    quality = [_fmt(scores.get("accuracy"), ".3f")] if closed_set else [
        _fmt(scores.get("f1"), ".3f"), _fmt(scores.get("exact_match"), ".3f")]
    return [
        *quality,
        *difference,
        _fmt(scores.get("recovery"), ".0%"),
        _fmt(scores.get("ttft_ms_median"), ",.0f"),
        _fmt(scores.get("translate_ms_median"), ",.1f"),
        _fmt(scores.get("kv_bytes_per_token"), ",.0f"),
        _fmt(scores.get("n"), ""),
    ]


def _fmt(value, spec: str) -> str:
    return _DASH if value is None else format(value, spec)


def _bar_chart(runs: list[dict], methods: list[str]) -> "Figure":
    """Grouped bars, one panel per metric family (accuracy, F1): one group per results file, one bar per method."""
    from matplotlib.figure import Figure

    families = _families(runs)
    widest = max(len(group) for _, _, group in families)
    figure = Figure(figsize=(max(6.0, 1.5 + max(0.3 * len(methods), 1.9) * widest), 3.8 * len(families)))
    width = 0.8 / len(methods)
    for row, (family, closed_set, group) in enumerate(families):
        axes = figure.add_subplot(len(families), 1, row + 1)
        top = 0.0
        for i, method in enumerate(methods):
            xs, heights = [], []
            for g, run in enumerate(group):
                value = _quality(run["methods"].get(method, {}), closed_set)
                if value is not None:
                    xs.append(g - 0.4 + width * (i + 0.5))
                    heights.append(value)
            axes.bar(xs, heights, width, label=method, color=f"C{i}")
            top = max([top, *heights])
        axes.set_xticks(range(len(group)), [_label(run).replace(", ", "\n") for run in group], fontsize=8)
        axes.set_xlim(-0.5, widest - 0.5)
        axes.set_ylabel(family)
        axes.set_ylim(0, min(1.0, top * 1.15) or 1.0)
        if row == 0:
            axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.tight_layout()
    return figure


def _scatter(runs: list[dict], methods: list[str]) -> "Figure":
    """Quality against median TTFT: colour = method, marker = results file."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    figure = Figure(figsize=(7, 4.5))
    axes = figure.add_subplot()
    for group, run in enumerate(runs):
        closed_set = _is_closed_set(run)
        for method, scores in run["methods"].items():
            quality, ttft = _quality(scores, closed_set), scores.get("ttft_ms_median")
            if quality is not None and ttft is not None:
                axes.scatter(ttft, quality, color=f"C{methods.index(method)}",
                             marker=_MARKERS[group % len(_MARKERS)])
    method_keys = [Line2D([], [], color=f"C{i}", marker="o", linestyle="", label=m) for i, m in enumerate(methods)]
    run_keys = [Line2D([], [], color="gray", marker=_MARKERS[g % len(_MARKERS)], linestyle="", label=_label(run))
                for g, run in enumerate(runs)]
    # Two legends beside the axes (add_artist keeps the first when the second is drawn).
    axes.add_artist(axes.legend(handles=method_keys, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7))
    axes.legend(handles=run_keys, loc="lower left", bbox_to_anchor=(1.01, 0), fontsize=7)
    axes.set_xlabel("median time to first token (ms)")
    axes.set_ylabel("quality (F1, or accuracy if closed-set)")
    axes.set_ylim(0, 1)
    return figure


def _save(figure: "Figure", path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)  # attaches the Agg canvas: no display or pyplot state needed
    figure.savefig(path, format="png", dpi=120, bbox_inches="tight")  # "tight" keeps outside legends


def _relative(target: Path, out_md: Path) -> str:
    """Link from the markdown file to `target`, with forward slashes."""
    return Path(os.path.relpath(target.resolve(), out_md.parent.resolve())).as_posix()


def translator_answers(digest: str, result_paths: list[Path]) -> list[dict]:
    """What the translator checkpoint with sha256[:16] `digest` scored in these results files: one entry per method
    that read it (each method records its checkpoint's digest), with the data, the placement, the questions, the
    quality, and the paired difference against each control in the same file (`select`, `none`); with `oracle` and
    `none` in the file also the share of the none -> oracle gap closed (`gap_closed`), and with `native` the share of
    native's lead over the control closed (`native_gap_closed`), each with its interval. For a translator's card, so
    the figures it shows are those of this checkpoint's own answers. A file where no method read it is refused."""
    entries = []
    for path in result_paths:
        run = _load_results(Path(path))
        closed_set = _is_closed_set(run)
        read = [m for m, scores in run["methods"].items() if scores.get("translator") == digest]
        if not read:
            raise CagkitError(f"{path}: no method read the translator {digest} (its methods read "
                              f"{', '.join(sorted({s.get('translator') or 'none' for s in run['methods'].values()}))}); "
                              f"pass results of `cagkit eval` run with this checkpoint")
        for method in read:
            scores = run["methods"][method]
            entry = {"results": str(path), "data": Path(run["dataset"]).name, "method": method,
                     "placement": _method_placement(run, scores, method),
                     "questions": scores.get("n"), "accuracy" if closed_set else "f1": _quality(scores, closed_set),
                     "ttft_ms_median": scores.get("ttft_ms_median"), "against": {}}
            for control in (_control(run), "none"):
                if control in run["methods"] and (pairs := _shared_scores(scores, run["methods"][control], closed_set)):
                    mean, low, high = paired_bootstrap([x - y for x, y in pairs])
                    entry["against"][control] = {"questions": len(pairs), "mean": mean, "low": low, "high": high}
            if ("none" in run["methods"] and "oracle" in run["methods"]  # over the questions all three answered
                    and (found := _gap_closed(*(_per_question(run["methods"][m], closed_set)
                                                for m in (method, "none", "oracle"))))):
                entry["gap_closed"] = found
            control = _control(run)
            if (control and "native" in run["methods"] and control != "native"  # the share of native's lead kept
                    and (found := _native_gap(run, method, control, closed_set))):
                entry["native_gap_closed"] = {"over": control, **found}
            entries.append(entry)
    return entries
