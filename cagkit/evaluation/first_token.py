"""`cagkit bench`: time to first token against document length, for a store written by the model itself, beside
native prefill, the `select` control and a plain `torch.save` cache.

    cagkit bench --model qwen-1.5b [--sizes 1024,4096,16384] [--repeats 3] [--text FILE] [--question Q]
        [--out results/bench-<model>.json] [--plot results/bench-<model>.png] [--report results/bench-<model>.md]
        [--replot]

The documents: for each size N, the opening of one text (default: a held-out Gutenberg book of the shared data,
`$CAGKIT_DATA/corpus/gutenberg/testing/chesterton-brown.txt`; `--text` any UTF-8 file), cut at the sentence end
(or paragraph end) whose token count in the model's tokenizer is nearest to N. Each is its own document (id
`<text stem>:<N>`) in one store per model (`--store`, default results/stores/bench/<model>), written by the model
itself: `ingest_texts(..., prefill="document")`, so every chunk's KV is its slice of the document read whole
after the prompt prefix (`cagkit.generation.context_prefix`). The ingest of each document is timed (prefill,
sentence embeddings and writing; the model already loaded).

Per size, one question (`--question`; the default asks about the default book's opening) and one new token; four
ways to the first token, side by side in one process and interleaved (each round runs all four, the order rotated
by one each round): one warm-up round, dropped (without native under `--no-native-warm-up`, for sizes where one
native prefill takes many minutes), then the median of `--repeats` rounds. Retrieval and the scope
choice are done once, before the clock starts, for all four.

- `native`: `answer_from_chunks(mode="native", scope="document")`: the model prefills the prompt prefix, the
  document's stored token ids and the question.
- `stored`: `answer_from_chunks(mode="stored", scope="document", placement=AS_STORED)`: the document's stored KV
  placed whole after the prefix (blend 0), then the question prefilled. For the store's own model this is native
  prefill's cache, so its first token should be native's.
- `select`: `answer_from_chunks(mode="select", scope="chunks")` over the top-4 chunks the store retrieves for the
  question within that document: the control, which reads no stored KV.
- `torch_save`: what a user would write with plain transformers instead of cagkit, as hhhuang/CAG ("Don't Do RAG")
  does: the prompt prefix and the document (the same token ids `stored` places) prefilled once into a transformers
  `DynamicCache` (only the last position's logits computed), `torch.save`d to a file; per question
  `torch.load(weights_only=False)` of that file, then the model forward over the question suffix and the argmax
  of the last position's logits. Timed from before the load to the token.

With `--source S` (a model other than `--model`), S ingests each document too (its own store, `--source-store`,
default results/stores/bench/<S>[-<dtype>]) and a fifth way runs beside the four:

- `translated`: `answer_from_chunks(mode=KIND, scope="document", placement=AS_STORED)` over S's store: S's
  stored KV of the document translated into `--model` by the `--translator` checkpoint (KIND, default `mot`)
  and placed whole, then the question prefilled: the first token of a store written by another model,
  translation included. Its answer is not expected to be native's.

Each size records the medians (and every round's times and `answer.timings`, whose parts say where the
first token's time went), their ratios to native, whether `stored` gives native's first token and `torch_save`'s,
the store's KV bytes on disk for the document against the torch.save file's bytes, the document's tokens, its
ingest time and rate, and the load average; the file holds the machine (threads, device, torch and transformers
versions, CPU count). Results go to `--out`, rewritten after the ingest and after every round, so a stopped run
keeps what it measured; a rerun skips the sizes already measured and redoes a size it left half done, keeping its
ingest and its torch.save file. Times compare
within one results file only. `--plot` draws the first-token time (log) against document tokens (log), `--report`
writes the table as Markdown (what the docs link to), and the table is printed; `--replot` redoes those three from
`--out` without loading a model.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch

from cagkit.bench import write_results

DEFAULT_QUESTION = "Who is the eminent criminologist whose consulting-rooms lay along the sea-front at Scarborough?"
METHODS = ("native", "stored", "select", "torch_save")
TRANSLATED = "translated"  # the fifth way, with --source
TOP_K = 4  # the select control's retrieved chunks, as `cagkit ask`'s default top-k
# A sentence ends after . ! or ? (and any closing quotes or brackets) before whitespace; a paragraph at a blank line.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s)|\n\s*\n")


DEFAULT_TEXT = "corpus/gutenberg/testing/chesterton-brown.txt"  # under $CAGKIT_DATA (default ../shared/data)


def default_text() -> Path:
    return Path(os.environ.get("CAGKIT_DATA", "../shared/data")) / DEFAULT_TEXT


def bench(args) -> dict:
    """Run (or, with `args.replot`, only redraw) the benchmark of `cagkit bench`; returns the results."""
    from cagkit.errors import CagkitError

    out = Path(args.out or f"results/bench-{args.model}.json")
    plot_path = f"results/bench-{args.model}.png" if args.plot is None else args.plot
    report_path = f"results/bench-{args.model}.md" if args.report is None else args.report
    if args.replot:
        if not out.exists():
            raise CagkitError(f"{out} does not exist; run `cagkit bench --model {args.model}` first (or name the "
                              f"results file with --out)")
        result = json.loads(out.read_text())
    else:
        if args.repeats < 1:
            raise CagkitError(f"--repeats must be 1 or more, got {args.repeats}")
        try:
            sizes = sorted({int(s) for s in args.sizes.split(",")})
        except ValueError:
            raise CagkitError(f"--sizes {args.sizes!r}: give document tokens as whole numbers, e.g. 1024,4096") from None
        if not sizes or sizes[0] < 16:
            raise CagkitError(f"--sizes {args.sizes!r}: each size must be at least 16 tokens")
        if getattr(args, "source", None) == args.model:
            raise CagkitError(f"--source {args.source} is --model itself, whose own store `stored` reads already; "
                              f"name another model to time a translated store")
        text = Path(args.text) if args.text else default_text()
        if not text.is_file():
            raise CagkitError(f"text {text} not found; pass --text FILE (any long UTF-8 text), or set $CAGKIT_DATA "
                              f"to the folder that holds {DEFAULT_TEXT}")
        result = run(args, sizes, out, text)
    print(table(result))
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(report(result, out, plot_path, Path(report_path)), encoding="utf-8")
    if plot_path:
        plot(result, Path(plot_path))
    return result


def run(args, sizes: list[int], out: Path, book: Path) -> dict:
    from cagkit.errors import CagkitError
    from cagkit.models.loading import load_model

    started = time.time()
    suffix = "" if args.dtype == "float16" else f"-{args.dtype}"
    store_dir = Path(args.store or f"results/stores/bench/{args.model}{suffix}")
    source = getattr(args, "source", None)
    source_dir = Path(getattr(args, "source_store", None) or f"results/stores/bench/{source}{suffix}") if source else None
    files_dir = Path("results/bench-files") / args.model  # the torch.save baseline's files, removed per size
    lm = load_model(args.model, args.device)
    settings = {
        "target": args.model, "dtype": args.dtype, "book": DEFAULT_TEXT if book == default_text() else str(book),
        "question": args.question, "repeats": args.repeats, "top_k": TOP_K,
        "store": str(store_dir), "threads": torch.get_num_threads(), "device": str(lm.device),
        "command": _command(args),
    }
    if source:
        from cagkit.translate.cards import checkpoint_digest, translator_path

        kind = args.translator
        checkpoint = translator_path(source, args.model, kind)
        if not checkpoint.is_file():
            raise CagkitError(f"no {kind} translator from {source} to {args.model}: {checkpoint} does not exist; "
                              f"train one (`cagkit translators train --source {source} --target {args.model}`) or "
                              f"point $CAGKIT_TRANSLATORS at the folder that holds it")
        settings.update(source=source, translator=kind, translator_sha256=checkpoint_digest(checkpoint),
                        source_store=str(source_dir))
    result = {"settings": settings, "rows": []}
    if out.exists():
        previous = json.loads(out.read_text())
        previous["settings"].setdefault("dtype", "float16")  # files from before --dtype
        for key in ("target", "book", "question", "dtype", "source", "translator", "translator_sha256"):
            if previous["settings"].get(key) != settings.get(key):
                raise CagkitError(f"{out} holds a run with {key} {previous['settings'].get(key)!r}, not "
                                  f"{settings.get(key)!r}; pass another --out")
        result["rows"] = previous["rows"]
        settings["runs"] = previous["settings"].get("runs", []) + [previous["settings"].get("command")]
    settings["started_at"] = time.strftime("%Y-%m-%d %H:%M")

    def save(done: bool = False) -> None:  # after every measurement, so a stopped run keeps what it measured
        settings["complete"] = done
        settings["wall_s"] = round(time.time() - started, 1)
        result["rows"].sort(key=lambda r: r["size"])
        write_results(out, result, device=lm.device)  # with the machine: cpus, torch, transformers

    text = book.read_text(encoding="utf-8")
    for size in sizes:
        row = next((r for r in result["rows"] if r["size"] == size), None)
        if row is not None and not row.get("partial") and "error" not in row:
            print(f"size {size}: measured already, skipped", flush=True)
            continue
        if row is not None:
            result["rows"].remove(row)
        new = {"size": size, "partial": True}
        result["rows"].append(new)
        try:
            measure_size(lm, args, book, text, size, store_dir, files_dir, new, row, save, source_dir)
            new.pop("partial")
        except (Exception, KeyboardInterrupt) as exc:  # keep the error in the file; a rerun tries the size again
            new["error"] = f"{type(exc).__name__}: {exc}"
            save()
            if isinstance(exc, KeyboardInterrupt) or isinstance(exc, MemoryError):
                raise
            print(f"size {size}: {new['error']}", flush=True)
            continue
        save()
    save(done=all("error" not in r and not r.get("partial") for r in result["rows"]))
    return result


def _ingest(model: str, store_dir: Path, doc_id: str, doc_text: str, args, kept: dict | None) -> dict:
    """Ingest one document by `model` into `store_dir`, timed; `kept`: the ingest a half-done run recorded."""
    from cagkit.ingest.pipeline import ingest_texts, remove

    report = ingest_texts([(doc_id, doc_text)], store=store_dir, source=model, prefill="document",
                          progress=False, device=args.device, dtype=args.dtype)
    if doc_id in report.unchanged:
        if kept:  # the half-done size's ingest, of this very document: keep it
            return kept
        # stored by a run that did not record its ingest: ingest it again to time it
        remove([doc_id], store=store_dir)
        report = ingest_texts([(doc_id, doc_text)], store=store_dir, source=model, prefill="document",
                              progress=False, device=args.device, dtype=args.dtype)
    if report.failed:
        raise RuntimeError(f"ingest by {model} failed: {report.failed}")
    return {"tokens": report.tokens, "chunks": report.chunks, "seconds": round(report.seconds, 3),
            "tokens_per_s": round(report.tokens_per_s, 1)}


def measure_size(lm, args, book: Path, text: str, size: int, store_dir: Path, files_dir: Path, row: dict, before: dict | None,
                 save, source_dir: Path | None = None) -> None:
    """Ingest the document of about `size` tokens (by the source too, with one), then time the methods on it into
    `row`."""
    from contextlib import ExitStack

    from cagkit.store.store import Store

    doc_text = opening(lm.tokenizer, text, size)
    doc_id = f"{book.stem}:{size}"
    row["ingest"] = _ingest(args.model, store_dir, doc_id, doc_text, args, (before or {}).get("ingest"))
    if source_dir is not None:
        row["source_ingest"] = _ingest(args.source, source_dir, doc_id, doc_text, args,
                                       (before or {}).get("source_ingest"))
    row["characters"] = len(doc_text)
    save()
    with ExitStack() as stack:
        store = stack.enter_context(Store.open(store_dir))
        source_store = stack.enter_context(Store.open(source_dir)) if source_dir is not None else None
        entry = _entry(store, doc_id)
        row.update(document=doc_id, document_tokens=entry["tokens"], chunks=entry["chunks"],
                   prefill=entry["prefill"], window=entry["window"], store_kv_bytes=entry["kv_bytes"],
                   store_dtype=store.settings.dtype)
        print(f"size {size}: {entry['tokens']} tokens, {entry['chunks']} chunks, ingest "
              f"{row['ingest']['seconds']:.1f} s ({row['ingest']['tokens_per_s']:.0f} tokens/s)", flush=True)
        timings_of = methods(lm, store, doc_id, args.question, files_dir / f"{size}.pt", row, before)
        if source_store is not None:
            timings_of[TRANSLATED] = translated(lm, source_store, doc_id, args.question, args.translator, row)
        names = tuple(timings_of)
        save()
        rounds = []
        row["rounds"] = rounds
        for r in range(args.repeats + 1):  # round 0 is the warm-up, dropped
            order = names[r % len(names):] + names[: r % len(names)]
            done = {"warm_up": r == 0, "order": list(order), "loadavg": [round(x, 2) for x in os.getloadavg()]}
            for name in order:
                if r == 0 and name == "native" and not getattr(args, "native_warm_up", True):
                    continue  # --no-native-warm-up
                done[name] = timings_of[name]()
            rounds.append(done)
            row.update(summarise(rounds, names))
            save()
            print(f"size {size} round {r}{' (warm-up)' if r == 0 else ''}: "
                  + ", ".join(f"{m} {done[m]['ttft_ms'] / 1e3:.2f} s" for m in names if m in done), flush=True)
    (files_dir / f"{size}.pt").unlink(missing_ok=True)


def methods(lm, store, doc_id: str, question: str, saved: Path, row: dict, before: dict | None = None) -> dict:
    """The four ways to the first token on document `doc_id`, each a function giving one run's
    {"ttft_ms", "answer", ...}; builds the torch.save baseline's file (recorded in `row`) on the way, or keeps the
    one a half-done run of this size left (`before`, its record) when it holds the same tokens and bytes."""
    from cagkit.config import AS_STORED, Placement
    from cagkit.generation import prompt_parts

    prefix, suffix = prompt_parts(lm, question)
    hits, placed = _placed_whole(lm, store, doc_id, question, row["chunks"])
    row["select_chunks"] = sorted(h.idx for h in hits)
    document_ids = [t for ids in store.token_ids([h.chunk_id for h in placed]) for t in ids]
    row["prompt_tokens"] = len(prefix) + len(document_ids) + len(suffix)
    kept = (before or {}).get("torch_save")
    if kept and kept["tokens"] == len(prefix) + len(document_ids) and saved.is_file() \
            and saved.stat().st_size == kept["bytes"]:
        row["torch_save"] = kept  # its prefill and save times are the run's that wrote the file
    else:
        row["torch_save"] = save_cache(lm, prefix + document_ids, saved)

    return {
        "native": _timed(lm, store, placed, question, "native", AS_STORED, "document"),
        "stored": _timed(lm, store, placed, question, "stored", AS_STORED, "document"),
        "select": _timed(lm, store, hits, question, "select", Placement(), "chunks"),
        "torch_save": lambda: load_and_answer(lm, saved, suffix),
    }


def translated(lm, source_store, doc_id: str, question: str, kind: str, row: dict):
    """The fifth way (`--source`): the source's stored KV of document `doc_id`, translated into `lm` by the `kind`
    translator and placed whole, then the question; a function giving one run's record, as `methods`' are."""
    from cagkit.config import AS_STORED

    entry = _entry(source_store, doc_id)
    _, placed = _placed_whole(lm, source_store, doc_id, question, entry["chunks"])
    row.update(source_document_tokens=entry["tokens"], source_chunks=entry["chunks"],
               source_store_kv_bytes=entry["kv_bytes"])
    return _timed(lm, source_store, placed, question, kind, AS_STORED, "document")


def _entry(store, doc_id: str) -> dict:
    """The store's summary of document `doc_id` (tokens, chunks, KV bytes, ...)."""
    return next(d for d in store.summary()["per_document"] if d["path"] == doc_id)


def _placed_whole(lm, store, doc_id: str, question: str, chunks: int) -> tuple[list, list]:
    """The question's top hits in document `doc_id` of `store`, and the chunks placed for them at document scope,
    which must be all `chunks` of the document."""
    from cagkit.ask import choose_scope
    from cagkit.generation import context_room, prompt_parts
    from cagkit.retrieval.search import retrieve

    hits = retrieve(store, question, TOP_K, documents=[doc_id])
    placed, scope, left_out = choose_scope(store, hits, "document", context_room(lm, *prompt_parts(lm, question), 1))
    if scope != "document" or left_out or len(placed) != chunks:
        raise RuntimeError(f"document scope placed {len(placed)} of {chunks} chunks of {store.path} "
                           f"({scope}, {left_out})")
    return hits, placed


def _timed(lm, store, hits, question: str, mode: str, placement, scope: str):
    """One way to the first token through `answer_from_chunks`: a function giving one run's record."""
    from cagkit.ask import answer_from_chunks

    def once() -> dict:
        answer = answer_from_chunks(lm, store, hits, question, mode, 1, placement=placement, scope=scope)
        return {**{k: round(v, 2) for k, v in answer.timings.items()}, "answer": answer.answer,
                "context_tokens": answer.context_tokens, "mode": answer.mode}
    return once


@torch.no_grad()
def save_cache(lm, ids: list[int], path: Path) -> dict:
    """hhhuang/CAG's `preprocess_knowledge` + `write_kv_cache`: prefill `ids` into a fresh DynamicCache and
    `torch.save` it. Returns the file's size and the time each step took."""
    from transformers import DynamicCache

    from cagkit.models.device import synchronize

    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    cache = DynamicCache()
    lm.model(input_ids=torch.tensor([ids], device=lm.device), cache=cache, use_cache=True, logits_to_keep=1)
    synchronize(lm.device)
    prefilled = time.perf_counter()
    torch.save(cache, path)
    saved = time.perf_counter()
    return {"bytes": path.stat().st_size, "tokens": len(ids), "dtype": str(cache.layers[0].keys.dtype),
            "prefill_s": round(prefilled - started, 3), "save_s": round(saved - prefilled, 3)}


@torch.no_grad()
def load_and_answer(lm, path: Path, suffix: list[int]) -> dict:
    """One question the torch.save way: load the saved cache, prefill the question suffix, take the first token."""
    from cagkit.models.device import synchronize

    started = time.perf_counter()
    cache = torch.load(path, weights_only=False, map_location=lm.device)
    synchronize(lm.device)
    loaded = time.perf_counter()
    logits = lm.model(input_ids=torch.tensor([suffix], device=lm.device), cache=cache, use_cache=True,
                      logits_to_keep=1).logits[0, -1]
    token = int(torch.argmax(logits))
    synchronize(lm.device)
    end = time.perf_counter()
    return {"ttft_ms": round((end - started) * 1e3, 2), "load_ms": round((loaded - started) * 1e3, 2),
            "prefill_ms": round((end - loaded) * 1e3, 2), "token": token,
            "answer": lm.tokenizer.decode([token], skip_special_tokens=True).strip()}


def summarise(rounds: list[dict], names: tuple[str, ...] = METHODS) -> dict:
    """Medians of the measured rounds (the warm-up round alone while it is all there is), ratios to native, and
    whether the first tokens agree."""
    measured = [r for r in rounds if not r["warm_up"]] or rounds
    if any(m not in r for r in measured for m in names):
        return {}  # only a warm-up round without native (--no-native-warm-up) so far
    median = {m: statistics.median(r[m]["ttft_ms"] for r in measured) for m in names}
    parts = {m: {k: statistics.median(r[m][k] for r in measured) for k in ("load_ms", "prefill_ms")} for m in names}
    if TRANSLATED in names:
        parts[TRANSLATED]["translate_ms"] = statistics.median(r[TRANSLATED]["translate_ms"] for r in measured)
    first = {m: rounds[-1][m]["answer"] for m in names}
    return {
        "measured_rounds": len([r for r in rounds if not r["warm_up"]]),
        "ttft_ms": {m: round(v, 1) for m, v in median.items()},
        "parts_ms": parts,
        "ratio_to_native": {m: round(median[m] / median["native"], 4) for m in names if m != "native"},
        "first_token": first,
        "stored_equals_native": all(r["stored"]["answer"] == r["native"]["answer"] for r in rounds if "native" in r),
        "stored_equals_torch_save": all(r["stored"]["answer"] == r["torch_save"]["answer"] for r in rounds),
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
    }


def opening(tokenizer, text: str, size: int) -> str:
    """The start of `text` up to the sentence or paragraph end nearest to `size` tokens of `tokenizer`."""
    window = text[: 8 * size + 2000]  # well over `size` tokens of English prose
    starts = [a for a, _ in tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]]
    if len(starts) <= size:
        raise RuntimeError(f"the text has only {len(starts)} tokens in its first {len(window)} characters, "
                           f"fewer than {size}; pass a longer --text or smaller --sizes")
    ends = [m.end() for m in _SENTENCE_END.finditer(window)]
    best = min(ends, key=lambda e: abs(bisect.bisect_left(starts, e) - size))
    return window[:best].rstrip()


def _command(args) -> str:
    """The `cagkit bench` command that reproduces this run (what was given, defaults left out)."""
    import shlex

    parts = ["cagkit", "bench", "--model", args.model, "--sizes", args.sizes, "--repeats", str(args.repeats)]
    if args.dtype != "float16":
        parts += ["--dtype", args.dtype]
    if not getattr(args, "native_warm_up", True):
        parts += ["--no-native-warm-up"]
    if getattr(args, "source", None):
        parts += ["--source", args.source, "--translator", args.translator]
    for option in ("text", "store", "source_store", "out", "threads", "device"):
        if getattr(args, option, None):
            parts += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    if args.question != DEFAULT_QUESTION:
        parts += ["--question", args.question]
    return shlex.join(parts)


def table(result: dict) -> str:
    """The results as a Markdown table, one row per size, with the run's conditions above it."""
    s = result["settings"]
    torch_version = s.get("torch") or result.get("machine", {}).get("torch", "?")
    source = s.get("source")
    extra = f" translated ({s['source']}, {s['translator']}) | translated/native | translate s |" if source else ""
    lines = [f"{s['target']} on {s['device']}, {s['threads']} threads, torch {torch_version}: first-token time "
             f"(s), median of {s['repeats']} after a warm-up", "",
             "| tokens | native | stored | torch.save | select | stored/native | torch.save/native | select/native | "
             "same first token (stored = native, = torch.save) | store KV MB | torch.save MB | ingest tokens/s |"
             + extra,
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|" + ("---:|---:|---:|" if source else "")]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['size']} | error: {r['error'][:80]} |")
            continue
        if "ttft_ms" not in r:
            lines.append(f"| {r['size']} | (not measured yet) |")
            continue
        t, q = r["ttft_ms"], r["ratio_to_native"]
        lines.append(
            f"| {r['document_tokens']} | {t['native'] / 1e3:.2f} | {t['stored'] / 1e3:.3f} | "
            f"{t['torch_save'] / 1e3:.3f} | {t['select'] / 1e3:.2f} | {q['stored']:.4f} | {q['torch_save']:.4f} | "
            f"{q['select']:.3f} | {r['stored_equals_native']}, {r['stored_equals_torch_save']} "
            f"({r['first_token']['native']!r}) | {r['store_kv_bytes'] / 1e6:.1f} | "
            f"{r['torch_save']['bytes'] / 1e6:.1f} | {r['ingest']['tokens_per_s']:.0f} |"
            + (f" {t[TRANSLATED] / 1e3:.3f} | {q[TRANSLATED]:.4f} | "
               f"{r['parts_ms'][TRANSLATED]['translate_ms'] / 1e3:.3f} |" if source and TRANSLATED in t else "")
            + (" partial" if r.get("partial") else ""))
    return "\n".join(lines)


def report(result: dict, out: Path, plot_path: str, page: Path) -> str:
    """The Markdown page `--report` writes at `page`: the table, the plot, and where both come from."""
    s = result["settings"]
    here = page.parent
    where = os.path.relpath(plot_path, here) if plot_path else None
    return "\n".join([
        f"# First token against document length: {s['target']}", "",
        f"Written by `cagkit bench` from [{out.name}]({os.path.relpath(out, here)}) (the command: "
        f"`{s.get('command', '')}`); times compare within this file only.", "", table(result), "",
        *([f"![first token against document length]({where})", ""] if where else []),
    ])


def plot(result: dict, path: Path) -> None:
    """First-token time (log) against document tokens (log), one line per method."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    rows = sorted((r for r in result["rows"] if "ttft_ms" in r and "error" not in r), key=lambda r: r["size"])
    s = result["settings"]
    figure = Figure(figsize=(7, 4.6))
    axes = figure.add_subplot(1, 1, 1)
    styles = {"native": ("native prefill", "o--", "C3"), "stored": ("cagkit stored (document scope)", "o-", "C0"),
              "torch_save": ("torch.save DynamicCache", "s-.", "C2"), "select": ("select (top-4 chunks)", "^:", "C1")}
    if s.get("source"):
        styles[TRANSLATED] = (f"translated from {s['source']} ({s['translator']})", "D-", "C4")
    xs = [r["document_tokens"] for r in rows]
    for method, (label, style, colour) in styles.items():
        axes.plot(xs, [r["ttft_ms"][method] / 1e3 for r in rows], style, color=colour, label=label)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    axes.set_xticks(xs)
    axes.xaxis.set_major_formatter(plain)
    axes.xaxis.set_minor_formatter(NullFormatter())
    axes.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    axes.yaxis.set_major_formatter(plain)
    axes.yaxis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("document tokens")
    axes.set_ylabel("time to first token (s)")
    axes.set_title(f"{s['target']}: first token from a document cache\n({s['device']}, {s['threads']} threads, "
                   f"median of {s['repeats']}, {s.get('started_at', '')})", fontsize=10)
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(figure)
    figure.savefig(path, format="png", dpi=110, bbox_inches="tight")

