"""The `cagkit` command: a thin layer over the library; each command calls one library function.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from pathlib import Path

from cagkit import __version__
from cagkit.config import (
    ALIGN_MODES,
    ASK_MODES,
    BLEND_SELECT,
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_MODEL,
    DEFAULT_RETRIEVAL,
    DEFAULT_SOURCE,
    DEFAULT_STORE,
    EVAL_METHODS,
    EXPERT_INPUTS,
    KV_DTYPES,
    RETRIEVAL_MODES,
    TRANSLATOR_KINDS,
    Placement,
)
from cagkit.errors import CagkitError
from cagkit.evaluation.datasets import FORMATS

DESCRIPTION = """Cache-augmented generation over long documents: prefill documents once with a cheap source model,
keep the KV cache in a store, and answer with any target model from translated caches."""


def _cmd_ingest(args) -> int:
    from cagkit.ingest.pipeline import ingest

    report = ingest(args.paths, store=args.store, source=args.source, chunk_tokens=args.chunk_tokens,
                    prune=args.prune, dtype=args.dtype, progress=not args.quiet, device=args.device)
    print(
        f"{len(report.added)} added, {len(report.updated)} updated, {len(report.unchanged)} unchanged, "
        f"{len(report.removed)} removed, {len(report.failed)} skipped; {report.chunks} chunks, {report.tokens} tokens "
        f"in {report.seconds:.1f} s ({report.tokens_per_s:.0f} tokens/s) -> {args.store}"
    )
    if report.upgraded:
        print(f"{len(report.upgraded)} unchanged documents were given the sentence embeddings this cagkit keeps")
    for path, reason in report.failed:
        print(f"skipped {path}: {reason}", file=sys.stderr)
    return 1 if report.failed else 0  # the rest is stored; a script still learns that something was left out


def _cmd_ask(args) -> int:
    from cagkit.ask import ask

    stream = None if args.json else (lambda piece: print(piece, end="", flush=True))
    result = ask(args.question, store=args.store, model=args.model, top_k=args.top_k, mode=args.mode,
                 max_new_tokens=args.max_new_tokens, on_text=stream, recompute_layers=args.recompute_layers,
                 blend=args.blend, blend_select=args.blend_select, device=args.device, retrieval=args.retrieval)
    if args.json:
        print(json.dumps(result.to_dict()))
        return 0
    print()
    print("\nsources:")
    for s in result.sources:
        print(f"  {s['score']:.3f}  {s['document']}  chunk {s['chunk']}")
    t = result.timings
    print(
        f"\n{result.model} ({result.mode}{Placement.from_settings(result.placement).describe()}), {result.context_tokens} "
        f"context tokens by {result.retrieval} retrieval: retrieve {t['retrieve_ms']:.0f} ms, "
        f"load {t['load_ms']:.0f} ms, translate {t['translate_ms'] - t['repair_ms']:.0f} ms, "
        f"repair {t['repair_ms']:.0f} ms, prefill {t['prefill_ms']:.0f} ms, "
        f"first token {t['ttft_ms']:.0f} ms, {t['tokens_per_s']:.1f} tokens/s"
    )
    return 0


def _cmd_models(args) -> int:
    from cagkit.models.registry import convert, describe_models

    for name in args.convert or []:
        print(f"converting {name} …", file=sys.stderr)
        convert(name)
    rows = describe_models()
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'model':<9} {'installed':<9} {'converted':<9} {'params':>8} {'layers':>6} {'kv heads':>8} {'head dim':>8} "
          f"{'KV B/token':>10}  description")
    for r in rows:
        params = f"{r['params'] / 1e6:.0f}M" if "params" in r else "-"
        print(f"{r['model']:<9} {'yes' if r['installed'] else 'no':<9} {'yes' if r['converted'] else 'no':<9} "
              f"{params:>8} {r.get('layers', '-'):>6} {r.get('kv_heads', '-'):>8} {r.get('head_dim', '-'):>8} "
              f"{r.get('kv_bytes_per_token', '-'):>10}  {r['description']}")
    return 0


def _cmd_translators_train(args) -> int:
    from cagkit.config import TrainSettings
    from cagkit.translate.train.training import train_translator

    settings = TrainSettings(examples=args.examples, threads=args.threads, recall_fraction=args.recall_fraction,
                             attention_weight=args.attention_weight, full_vocab_kl=args.full_vocab_kl,
                             kv_weight=args.kv_weight, kl_weight=args.ccl_weight, hidden_weight=args.ccl_weight,
                             prefix_tokens=args.prefix_tokens, seed=args.seed, qa_data=args.qa,
                             qa_format=args.qa_format, qa_skip=args.qa_skip,
                             qa_fraction=args.qa_fraction if args.qa_fraction is not None else 0.5 if args.qa else 0.0,
                             sizes={**({"align_mode": args.align} if args.align else {}),
                                    **({"token_window": args.token_window} if args.token_window != 1 else {}),
                                    **{name: getattr(args, name) for name in ("window", "width", "expert_hidden",
                                                                               "num_experts", "top_k", "expert_inputs")
                                       if getattr(args, name) is not None},
                                    **_focus(args)},
                             **({"lr": args.lr} if args.lr is not None else {}))
    out = train_translator(source=args.source, target=args.target, corpus=args.corpus, steps=args.steps,
                           out=args.out, kind=args.kind, work_dir=args.work_dir, settings=settings, init=args.init)
    print(f"wrote {out}")
    return 0


def _focus(args) -> dict:
    """The focused layers' sizes from --focus-layers and --focus-scale (3 when only the layers are given)."""
    if not args.focus_layers:
        if args.focus_scale is not None:
            raise CagkitError("--focus-scale widens the layers --focus-layers names; pass --focus-layers too")
        return {}
    try:
        layers = tuple(int(layer) for layer in args.focus_layers.split(","))
    except ValueError:
        raise CagkitError(f"--focus-layers {args.focus_layers}: give comma-separated target layer numbers, "
                          f"e.g. 16 or 9,16") from None
    return {"focus_layers": layers, "focus_scale": args.focus_scale if args.focus_scale is not None else 3}


def _cmd_translators_score(args) -> int:
    from cagkit.translate.train.training import score_translator

    for checkpoint in args.checkpoints:
        heldout = score_translator(checkpoint, corpus=args.corpus)
        recall = heldout["recall"]
        print(f"{checkpoint}: next text {heldout['recovery']['translated']:.2f} / "
              f"{heldout['kl_recovery']['translated']:.2f}, recall {recall['recovery']['translated']:.2f} / "
              f"{recall['kl_recovery']['translated']:.2f} (loss / KL recovery); card updated")
    return 0


def _cmd_translators_list(args) -> int:
    from cagkit.translate.cards import HELDOUT_BAR, list_translators, translators_dir

    rows = list_translators(args.dir)
    if args.json:
        print(json.dumps(rows))
        return 0
    if not rows:
        print(f"no translators in {args.dir or translators_dir()}; train one with `cagkit translators train`")
        return 0

    def score(a, b) -> str:
        return "-" if a is None or b is None else f"{a:.2f} / {b:.2f}"

    print(f"{'source':<8} {'target':<8} {'kind':<9} {'steps':>5} {'tokens':>7}  {'next text':>11}  {'recall':>11}  "
          f"bar ({HELDOUT_BAR:.0%} of next text)")
    for r in rows:
        tokens = f"{r['training_tokens'] / 1000:.1f}k" if r["training_tokens"] else "-"
        print(f"{r['source']:<8} {r['target']:<8} {r['kind']:<9} {r['steps'] if r['steps'] is not None else '-':>5} "
              f"{tokens:>7}  {score(r['next_loss'], r['next_kl']):>11}  {score(r['recall_loss'], r['recall_kl']):>11}  "
              f"{r['bar']}")
    print("held-out recovery, loss / KL: the share of the no-context -> native gap the translated context closes")
    return 0


def _cmd_store_info(args) -> int:
    from cagkit.store.store import Store

    with Store.open(args.store) as st:
        info = st.summary()
    if args.json:
        print(json.dumps(info))
        return 0
    s = info["settings"]
    print(f"{info['store']}: {info['documents']} documents, {info['chunks']} chunks, {info['tokens']} tokens, "
          f"{info['bytes'] / 1e6:.1f} MB")
    print(f"source {s['source']} (fingerprint {s['source_fingerprint']}), {s['dtype']} KV, chunks of at most "
          f"{s['chunk_tokens']} tokens, embedder {s['embedder']}, format {s['format_version']}")
    if info["per_document"]:
        print(f"\n{'chunks':>6} {'tokens':>7} {'KV MB':>7}  {'state':<12}  document")
    for d in info["per_document"]:
        print(f"{d['chunks']:>6} {d['tokens']:>7} {d['kv_bytes'] / 1e6:>7.1f}  {d['state']:<12}  {d['path']}")
    stale = sum(d["state"] != "ok" for d in info["per_document"])
    if stale:
        print(f"\n{stale} of {info['documents']} documents need `cagkit ingest` again (damaged ones are rebuilt, "
              f"older ones get the sentence embeddings the default repair selects by)")
    return 0


def _cmd_store_remove(args) -> int:
    from cagkit.ingest.pipeline import remove

    removed = remove(args.paths, store=args.store)
    for path in removed:
        print(f"removed {path}")
    print(f"{len(removed)} document{'s' * (len(removed) != 1)} removed from {args.store}")
    return 0


def _cmd_eval(args) -> int:
    from cagkit.evaluation.runner import run_eval

    out = run_eval(data=args.data, source=args.source, target=args.target, methods=args.methods.split(","),
                   limit=args.limit, top_k=args.top_k, full_context=args.full_context, out=args.out,
                   data_format=args.format, max_new_tokens=args.max_new_tokens, store=args.store,
                   chunk_tokens=args.chunk_tokens, recompute_layers=args.recompute_layers, blend=args.blend,
                   blend_select=args.blend_select, device=args.device, retrieval=args.retrieval)
    print(f"wrote {out}")
    return 0


def _cmd_report(args) -> int:
    from cagkit.evaluation.report import write_report

    write_report([Path(p) for p in args.results], Path(args.out), Path(args.plots), note=args.note)
    print(f"wrote {args.out}")
    return 0


def _cmd_compare(args) -> int:
    from cagkit.evaluation.report import compare

    rows = compare(args.runs)
    if args.json:
        print(json.dumps(rows))
        return 0
    name = max(len(f"{r['file']}:{r['method']}") for r in rows)
    place = max(len(r["placement"]) for r in rows)
    print(f"{'run':<{name}}  {'target':<8} {'placement':<{place}} {'n':>4} {'quality':>7} {'/ first':>7}  "
          f"− first (95% interval)")
    for r in rows:
        d = r["difference"]
        diff = "" if d is None else f"{d['mean']:+.3f} ({d['low']:+.3f} to {d['high']:+.3f}), {d['questions']} q"
        quality = "-" if r["quality"] is None else f"{r['quality']:.3f}"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        print(f"{r['file'] + ':' + r['method']:<{name}}  {r['target']:<8} {r['placement']:<{place}} "
              f"{r['n'] if r['n'] is not None else '-':>4} {quality:>7} {ratio:>7}  {diff}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    store_default = os.environ.get("CAGKIT_STORE", str(DEFAULT_STORE))
    parser = argparse.ArgumentParser(prog="cagkit", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"cagkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="prefill documents with the source model and store their KV cache",
                       epilog="exit status: 0 when every document is stored or unchanged; 1 when some could not be "
                              "read (each is named on stderr, the others are stored); 2 on an error that stopped "
                              "the run (what was finished is kept)")
    p.add_argument("paths", nargs="+", help="files or folders (.txt .md .rst .html .pdf)")
    p.add_argument("--store", default=store_default, help="store directory (default: %(default)s, or $CAGKIT_STORE)")
    p.add_argument("--source", default=DEFAULT_SOURCE, help="source model: alias, Hugging Face id or directory (default: %(default)s)")
    p.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS, help="most source tokens per chunk (default: %(default)s)")
    p.add_argument("--prune", action="store_true", help="drop stored documents whose files are no longer under PATHS")
    p.add_argument("--dtype", default="float16", choices=list(KV_DTYPES), help="stored KV dtype (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_device_option(p)
    p.set_defaults(func=_cmd_ingest)

    p = sub.add_parser("ask", help="answer a question from the stored documents")
    p.add_argument("question")
    p.add_argument("--store", default=store_default, help="store directory (default: %(default)s, or $CAGKIT_STORE)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="target model (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=4, help="chunks to retrieve (default: %(default)s)")
    _add_retrieval_option(p)
    p.add_argument("--mode", default="mot", choices=ASK_MODES,
                   help="mot: translate the stored KV (default); native: the target prefills the chunk text; "
                        "linear/projector: single-path baseline translators; oracle (diagnostic): the target "
                        "prefills each chunk alone, the cache a perfect translator would give")
    _add_placement_options(p)
    p.add_argument("--max-new-tokens", type=int, default=64, help="longest answer in tokens (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object: answer, sources, timings, model, mode, "
                                                             "context_tokens, placement and retrieval")
    _add_device_option(p)
    p.set_defaults(func=_cmd_ask)

    p = sub.add_parser("store", help="what a store holds, or drop documents from it")
    ssub = p.add_subparsers(dest="store_command", required=True)
    t = ssub.add_parser("info", help="the store's settings and, per document, chunks, tokens, KV size and state")
    t.add_argument("--store", default=store_default, help="store directory (default: %(default)s, or $CAGKIT_STORE)")
    t.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    t.set_defaults(func=_cmd_store_info)
    t = ssub.add_parser("remove", help="drop documents (by file, or every one under a folder) without re-ingesting")
    t.add_argument("paths", nargs="+", help="stored documents: their files or folders, or ids given to ingest_texts")
    t.add_argument("--store", default=store_default, help="store directory (default: %(default)s, or $CAGKIT_STORE)")
    t.set_defaults(func=_cmd_store_remove)

    p = sub.add_parser("models", help="list the known models: installed, converted, shape, KV bytes per token")
    p.add_argument("--convert", nargs="*", metavar="MODEL", help="convert these models now (first use does it anyway)")
    p.add_argument("--json", action="store_true", help="print the list as one JSON object")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("translators", help="train KV translators between models, or list them")
    tsub = p.add_subparsers(dest="translators_command", required=True)
    t = tsub.add_parser("train", help="train a translator from SOURCE's KV space to TARGET's (resumes if interrupted)")
    t.add_argument("--source", required=True, help="the model whose stored KV is translated (alias or directory)")
    t.add_argument("--target", required=True, help="the model that reads the translated KV (alias or directory)")
    t.add_argument("--corpus", required=True,
                   help="folder of .txt files: those under a testing/ folder or named test.txt are held out for "
                        "the card's scores, the rest are trained on (both must exist)")
    t.add_argument("--steps", type=int, default=None, help="optimisation steps (default: 600; more continues a finished run)")
    t.add_argument("--kind", default="mot", choices=TRANSLATOR_KINDS,
                   help="mot (experts and router), projector (one MLP per layer) or linear (ridge, closed form) "
                        "(default: %(default)s)")
    t.add_argument("--examples", type=int, default=200,
                   help="training passages of PREFIX_TOKENS+32 target tokens (default: %(default)s)")
    t.add_argument("--prefix-tokens", type=int, default=128,
                   help="target tokens of each training passage's translated prefix (default: %(default)s; "
                        "held-out scoring always uses 128, so cards compare)")
    t.add_argument("--recall-fraction", type=float, default=0.5,
                   help="share of examples whose replayed continuation repeats a span of the passage (default: %(default)s)")
    t.add_argument("--attention-weight", type=float, default=0.0,
                   help="weight of the attention loss: the continuation's native queries must attend over the "
                        "translated keys as over the native ones (default: %(default)s, off)")
    t.add_argument("--kv-weight", type=float, default=1.0,
                   help="weight of the KV reconstruction loss against the target's native keys and values "
                        "(default: %(default)s; 0 trains on the Context Correction Loss alone)")
    t.add_argument("--ccl-weight", type=float, default=1.0,
                   help="weight of the Context Correction Loss, its logits KL and its hidden-state term alike "
                        "(default: %(default)s; 0 trains on the KV loss alone and skips the target's replay "
                        "backward pass)")
    t.add_argument("--full-vocab-kl", action="store_true",
                   help="the Context Correction Loss's KL over the whole vocabulary (the native top-64 tokens plus "
                        "one bin for the rest) instead of over the native top-64 renormalised; costs the target's "
                        "full LM head on every replayed token")
    t.add_argument("--align", default=None, choices=ALIGN_MODES,
                   help="how a target token reads the source tokens: the one covering its last character (cover, "
                        "the default), or every overlapping one weighted by shared characters (overlap)")
    t.add_argument("--token-window", type=int, default=1,
                   help="target positions whose source features each token reads: itself and the N-1 before it "
                        "in its chunk (default: %(default)s, the token alone)")
    t.add_argument("--window", type=int, default=None,
                   help="source layers each target layer reads, centred on the one matched by depth (default: 3, "
                        "or one per expert with --expert-inputs depth)")
    t.add_argument("--width", type=int, default=None,
                   help="trunk width of each layer's translator (default: 160; mot and projector)")
    t.add_argument("--expert-hidden", type=int, default=None,
                   help="hidden units of each expert MLP (default: 96 for mot, 192 for the projector's one)")
    t.add_argument("--experts", dest="num_experts", type=int, default=None,
                   help="expert MLPs per layer (default: 4; mot only)")
    t.add_argument("--top-k", dest="top_k", type=int, default=None,
                   help="experts the router picks per token (default: 2; mot only)")
    t.add_argument("--expert-inputs", dest="expert_inputs", default=None, choices=EXPERT_INPUTS,
                   help="what each expert reads: the shared trunk (trunk, the default), or one source layer each "
                        "plus the token identity (depth; the source window then defaults to one layer per "
                        "expert); mot only")
    t.add_argument("--focus-layers", default=None, metavar="L,...",
                   help="target layers that get --focus-scale times the trunk width and expert hidden units, e.g. "
                        "those that `benchmarks/layer_damage.py` finds lose the most (default: none)")
    t.add_argument("--focus-scale", type=int, default=None, metavar="F",
                   help="how many times wider the --focus-layers' translators are (default: 3)")
    t.add_argument("--seed", type=int, default=0,
                   help="seeds the training passages, the initialisation and the batch order (default: %(default)s; "
                        "the held-out passages stay the same, so runs of other seeds compare)")
    t.add_argument("--qa", default=None, metavar="FILE",
                   help="a question-answering file (any format `cagkit eval` reads): some examples' continuations "
                        "then ask one of its questions and give its answer after a passage that holds it")
    t.add_argument("--qa-format", default=None, choices=FORMATS, help="the --qa file's format (default: detected)")
    t.add_argument("--qa-fraction", type=float, default=None,
                   help="share of examples with a question-answer continuation (default: 0.5 with --qa, else 0)")
    t.add_argument("--qa-skip", type=int, default=0, metavar="N",
                   help="leave out the --qa file's first N questions and every question on their documents, "
                        "e.g. the N that `cagkit eval --limit N` scores (default: %(default)s)")
    t.add_argument("--init", default=None, help="start from this checkpoint of the same pair and kind (fine-tuning)")
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (default: 1e-3)")
    t.add_argument("--threads", type=int, default=1, metavar="N",
                   help="CPU threads for training (default: %(default)s; $CAGKIT_THREADS does not apply here)")
    t.add_argument("--work-dir", default=None, help="paired-prefill data and resumable state (default: $CAGKIT_HOME/train/SOURCE__TARGET)")
    t.add_argument("--out", default=None,
                   help="checkpoint path (default: SOURCE__TARGET.safetensors for mot, SOURCE__TARGET.KIND."
                        "safetensors otherwise, in $CAGKIT_TRANSLATORS or translators/)")
    t.set_defaults(func=_cmd_translators_train)
    t = tsub.add_parser("score", help="score trained checkpoints on held-out text again and update their cards")
    t.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=".safetensors translator files")
    t.add_argument("--corpus", default=None, help="the corpus they were trained on (default: the one in the card)")
    t.set_defaults(func=_cmd_translators_score)
    t = tsub.add_parser("list", help="the translators cagkit uses, with their held-out scores from the cards")
    t.add_argument("--dir", default=None, help="folder of checkpoints (default: the shipped translators/, or "
                                                "$CAGKIT_TRANSLATORS)")
    t.add_argument("--json", action="store_true", help="print the list as one JSON object")
    t.set_defaults(func=_cmd_translators_list)

    p = sub.add_parser("eval", help="measure answer quality and speed of each method on a QA data set")
    p.add_argument("--data", required=True, help="JSONL (cagkit format), SQuAD v2 JSON, HotpotQA, L-Eval or RACE file")
    p.add_argument("--format", default=None, choices=FORMATS, help="data format (default: detected from the file)")
    p.add_argument("--source", default=DEFAULT_SOURCE, help="model that ingests the documents (default: %(default)s)")
    p.add_argument("--target", required=True, help="model that answers")
    p.add_argument("--methods", default="native,none,source,linear,projector,mot",
                   help=f"comma-separated, of {', '.join(EVAL_METHODS)} (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="first N questions only")
    p.add_argument("--top-k", type=int, default=4, help="chunks to retrieve (default: %(default)s)")
    p.add_argument("--full-context", action="store_true", help="give every method the whole context, no retrieval")
    _add_retrieval_option(p)
    _add_placement_options(p)
    p.add_argument("--max-new-tokens", type=int, default=24, help="longest answer in tokens (default: %(default)s)")
    p.add_argument("--store", default=None,
                   help="store to ingest the documents into (default: results/stores/<data>-<source>, shared by "
                        "every run over the same data and source)")
    p.add_argument("--chunk-tokens", type=int, default=DEFAULT_CHUNK_TOKENS,
                   help="most source tokens per chunk of that store (default: %(default)s; another size gets its "
                        "own default store and results file, ending in -c<size>)")
    p.add_argument("--out", default=None, help="results JSON (default: results/<data>-<source>-<target>.json)")
    _add_device_option(p)
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("report", help="write BENCHMARKS.md tables and plots from eval results")
    p.add_argument("results", nargs="+", help="results files of `cagkit eval`")
    p.add_argument("--out", default="BENCHMARKS.md", help="report to write (default: %(default)s)")
    p.add_argument("--plots", default="docs/plots", help="folder for the charts (default: %(default)s)")
    p.add_argument("--note", default=None, help="a paragraph under the title: how and where the runs were made")
    p.set_defaults(func=_cmd_report)

    p = sub.add_parser("compare", help="paired differences between eval runs: each FILE[:METHOD] against the first")
    p.add_argument("runs", nargs="+", metavar="FILE[:METHOD]",
                   help="results files of `cagkit eval` over the same data, each with the method to compare "
                        "(default: mot); the first is the baseline")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON object")
    p.set_defaults(func=_cmd_compare)
    return parser


def _add_retrieval_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retrieval", default=DEFAULT_RETRIEVAL, choices=RETRIEVAL_MODES,
                   help="how chunks are ranked for the question: hybrid (the embedding's and BM25's rankings fused "
                        "by reciprocal rank), dense (the embedding alone) or lexical (BM25 alone) (default: "
                        "%(default)s)")


def _add_placement_options(p: argparse.ArgumentParser) -> None:
    """The ask-time speed/quality options (`cagkit.placement.Placement`), shared by ask and eval."""
    p.add_argument("--recompute-layers", type=int, default=Placement.recompute_layers, metavar="K",
                   help="translated modes: the target recomputes its bottom K layers over each chunk (about K/L of "
                        "a native prefill) and only the layers above are translated (default: %(default)s)")
    p.add_argument("--blend", type=float, default=Placement.blend, metavar="R",
                   help="recompute this share of the context tokens with attention across all retrieved chunks, "
                        "which chunks stored one at a time never had (0 to 1; 0 places them as stored, the fastest; "
                        "1 is a joint prefill; default: %(default)s)")
    p.add_argument("--blend-select", default=Placement.blend_select, metavar="{" + ",".join(BLEND_SELECT) + "}",
                   help="which tokens --blend recomputes: whole sentences, most similar to the question first, or "
                        "those whose KV deviates most from a joint prefill of the bottom layers (CacheBlend's "
                        "choice) (default: %(default)s)")


def _add_device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="where the models run: auto (CUDA when PyTorch sees a GPU, else the CPU), cpu, cuda or "
                        "cuda:N (default: $CAGKIT_DEVICE, else auto)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for the models (default: $CAGKIT_THREADS, else $OMP_NUM_THREADS, else "
                        "PyTorch's default of one per core); on a machine other jobs keep busy, fewer run faster")


def _set_threads(args) -> None:
    """Apply --threads (or $CAGKIT_THREADS) to PyTorch; without either PyTorch keeps its own setting."""
    given, name = getattr(args, "threads", None), "--threads"
    if given is None and os.environ.get("CAGKIT_THREADS", "").strip():
        raw, name = os.environ["CAGKIT_THREADS"].strip(), "CAGKIT_THREADS"
        if not raw.isdigit():
            raise CagkitError(f"CAGKIT_THREADS={raw!r} is not a number of threads; set it to 1 or more, or unset it")
        given = int(raw)
    if given is None:
        return
    if given < 1:
        raise CagkitError(f"{name} {given}: give 1 or more CPU threads")
    import torch

    torch.set_num_threads(given)


# glibc keeps this much free memory at the top of its heap instead of handing it back to the kernel.
_TOP_PAD = 1 << 30


def _keep_freed_memory() -> None:
    """Let glibc reuse freed tensor memory instead of returning it to the kernel and faulting it in again.

    Translation and prefill allocate and free tens of MB per layer; by default glibc serves such blocks from
    fresh pages each time, and touching them costs more than the arithmetic (a fresh `cagkit ask` on gemma
    spent 1.2 s translating 777 tokens, 0.35 s with this). A top pad of 1 GiB keeps up to that much freed
    memory in the process. `MALLOC_TOP_PAD_` in the environment (0 turns it off) takes precedence. Only the
    CLI does this: a program that imports cagkit keeps its own allocator settings.
    """
    if not sys.platform.startswith("linux") or "MALLOC_TOP_PAD_" in os.environ:
        return
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-2, _TOP_PAD)  # M_TOP_PAD; musl's mallopt does nothing, other libcs lack it
    except (OSError, AttributeError):
        pass


def _quiet_libraries() -> None:
    """Keep the terminal for cagkit's own output: the CLI reports skipped documents itself.

    transformers reads its verbosity and progress-bar settings from the environment when it is first imported,
    so a command that never loads a model does not pay for importing it here; a setting the user exported wins.
    """
    from cagkit.errors import SkippedDocumentWarning

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # imported already (cagkit used as a library before `main`)
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=SkippedDocumentWarning)
    logging.getLogger("pypdf").setLevel(logging.ERROR)  # a damaged PDF's details: the skip line names the file
    warnings.filterwarnings("ignore", module="transformers")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _keep_freed_memory()
    _quiet_libraries()
    try:
        if hasattr(args, "device"):  # the commands that run models
            _set_threads(args)
        if getattr(args, "device", None):
            from cagkit.models.loading import resolve_device

            resolve_device(args.device)  # a bad --device fails before any work, not after an ingest
        if hasattr(args, "blend"):  # so do placement options out of range, before a model loads
            Placement(args.recompute_layers, args.blend, args.blend_select).check()
        return args.func(args)
    except CagkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; what was finished is kept (re-run to continue)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
