"""`cagkit translators train|score|answers|list`: train KV translators between models, score them on held-out text,
record in their cards what they scored on questions, list them (`cagkit.translate.train`, `cagkit.translate.cards`,
`cagkit.evaluation.report.translator_answers`)."""

from __future__ import annotations

import json

from cagkit.config import (
    ALIGN_MODES,
    DEFAULT_QA_FRACTION,
    TRANSLATOR_KINDS,
    TRANSLATOR_SIZES,
    TrainSettings,
)
from cagkit.errors import CagkitError
from cagkit.evaluation.datasets import FORMATS

_TRAIN = TrainSettings()  # the defaults of a training run


def add_parser(sub) -> None:
    p = sub.add_parser("translators", help="train KV translators between models, or list them")
    tsub = p.add_subparsers(dest="translators_command", required=True)
    t = tsub.add_parser("train", help="train a translator from SOURCE's KV space to TARGET's (resumes if interrupted)")
    t.add_argument("--source", required=True, help="the model whose stored KV is translated (alias or directory)")
    t.add_argument("--target", required=True, help="the model that reads the translated KV (alias or directory)")
    t.add_argument("--corpus", required=True,
                   help="folder of .txt files: those under a testing/ folder or named test.txt are held out for "
                        "the card's scores, the rest are trained on (both must exist)")
    t.add_argument("--steps", type=int, default=None, help=f"optimisation steps (default: {_TRAIN.steps}; more continues a finished run)")
    t.add_argument("--kind", default=TRANSLATOR_KINDS[0], choices=TRANSLATOR_KINDS,
                   help="mot (experts and router), projector (one MLP per layer) or linear (ridge, closed form) "
                        "(default: %(default)s)")
    t.add_argument("--examples", type=int, default=_TRAIN.examples,
                   help=f"training passages of PREFIX_TOKENS+{_TRAIN.continuation_tokens} target tokens (default: %(default)s)")
    t.add_argument("--prefix-tokens", type=int, default=_TRAIN.prefix_tokens,
                   help="target tokens of each training passage's translated prefix (default: %(default)s; "
                        f"held-out scoring always uses {_TRAIN.heldout_prefix_tokens}, so cards compare)")
    t.add_argument("--recall-fraction", type=float, default=_TRAIN.recall_fraction,
                   help="share of examples whose replayed continuation repeats a span of the passage (default: %(default)s)")
    t.add_argument("--kv-weight", type=float, default=_TRAIN.kv_weight,
                   help="weight of the KV reconstruction loss against the target's native keys and values "
                        "(default: %(default)s; 0 trains on the Context Correction Loss alone)")
    t.add_argument("--ccl-weight", type=float, default=_TRAIN.kl_weight,
                   help="weight of the Context Correction Loss, its logits KL and its hidden-state term alike "
                        "(default: %(default)s; 0 trains on the KV loss alone and skips the target's replay "
                        "backward pass)")
    t.add_argument("--full-vocab-kl", action="store_true",
                   help="the Context Correction Loss's KL over the whole vocabulary (the native top-64 tokens plus "
                        "one bin for the rest) instead of over the native top-64 renormalised; costs the target's "
                        "full LM head on every replayed token")
    t.add_argument("--align", default=None, choices=ALIGN_MODES,
                   help="how a target token reads the source tokens: the one covering its last character (cover), or "
                        "every overlapping one weighted by shared characters (overlap) (default: "
                        f"{TRANSLATOR_SIZES.align_mode})")
    t.add_argument("--window", type=int, default=None,
                   help="source layers each target layer reads, centred on the one matched by depth (default: "
                        f"{TRANSLATOR_SIZES.window})")
    t.add_argument("--width", type=int, default=None,
                   help=f"trunk width of each layer's translator (default: {TRANSLATOR_SIZES.width}; mot and projector)")
    t.add_argument("--expert-hidden", type=int, default=None,
                   help=f"hidden units of each expert MLP (default: {TRANSLATOR_SIZES.expert_hidden} for mot, "
                        f"{2 * TRANSLATOR_SIZES.expert_hidden} for the projector's one)")
    t.add_argument("--experts", dest="num_experts", type=int, default=None,
                   help=f"expert MLPs per layer (default: {TRANSLATOR_SIZES.num_experts}; mot only)")
    t.add_argument("--top-k", dest="top_k", type=int, default=None,
                   help=f"experts the router picks per token (default: {TRANSLATOR_SIZES.top_k}; mot only)")
    t.add_argument("--seed", type=int, default=_TRAIN.seed,
                   help="seeds the training passages, the initialisation and the batch order (default: %(default)s; "
                        "the held-out passages stay the same, so runs of other seeds compare)")
    t.add_argument("--qa", default=None, metavar="FILE",
                   help="a question-answering file (any format `cagkit eval` reads): some examples' continuations "
                        "then ask one of its questions and give its answer after a passage that holds it")
    t.add_argument("--qa-format", default=None, choices=FORMATS, help="the --qa file's format (default: detected)")
    t.add_argument("--qa-fraction", type=float, default=None,
                   help=f"share of examples with a question-answer continuation (default: {DEFAULT_QA_FRACTION} with --qa, "
                        f"else {_TRAIN.qa_fraction:g})")
    t.add_argument("--qa-skip", type=int, default=_TRAIN.qa_skip, metavar="N",
                   help="leave out the --qa file's first N questions and every question on their documents, "
                        "e.g. the N that `cagkit eval --limit N` scores (default: %(default)s)")
    t.add_argument("--init", default=None, help="start from this checkpoint of the same pair and kind (fine-tuning)")
    t.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default: {_TRAIN.lr:g})")
    t.add_argument("--threads", type=int, default=_TRAIN.threads, metavar="N",
                   help="CPU threads for training (default: %(default)s; $CAGKIT_THREADS does not apply here)")
    t.add_argument("--work-dir", default=None, help="paired-prefill data and resumable state (default: $CAGKIT_HOME/train/SOURCE__TARGET)")
    t.add_argument("--out", default=None,
                   help="checkpoint path (default: SOURCE__TARGET.safetensors for mot, SOURCE__TARGET.KIND."
                        "safetensors otherwise, in $CAGKIT_TRANSLATORS or translators/)")
    t.set_defaults(func=run_train)
    t = tsub.add_parser("score", help="score trained checkpoints on held-out text again and update their cards")
    t.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT", help=".safetensors translator files")
    t.add_argument("--corpus", default=None, help="the corpus they were trained on (default: the one in the card)")
    t.set_defaults(func=run_score)
    t = tsub.add_parser("answers", help="record in a checkpoint's card what it scored in `cagkit eval` results files")
    t.add_argument("checkpoint", metavar="CHECKPOINT", help="the .safetensors translator the results were answered with")
    t.add_argument("results", nargs="+", metavar="RESULTS",
                   help="results files of `cagkit eval` in which a method read this checkpoint (runs with "
                        "$CAGKIT_TRANSLATORS pointing at its folder, or the shipped one)")
    t.set_defaults(func=run_answers)
    t = tsub.add_parser("list", help="the translators cagkit uses, with their held-out scores from the cards")
    t.add_argument("--dir", default=None, help="folder of checkpoints (default: the shipped translators/, or "
                                                "$CAGKIT_TRANSLATORS)")
    t.add_argument("--json", action="store_true", help="print the list as one JSON object")
    t.set_defaults(func=run_list)


def run_train(args) -> int:
    from cagkit.config import TrainSettings
    from cagkit.translate.train import train_translator

    settings = TrainSettings(examples=args.examples, threads=args.threads, recall_fraction=args.recall_fraction,
                             full_vocab_kl=args.full_vocab_kl,
                             kv_weight=args.kv_weight, kl_weight=args.ccl_weight, hidden_weight=args.ccl_weight,
                             prefix_tokens=args.prefix_tokens, seed=args.seed, qa_data=args.qa,
                             qa_format=args.qa_format, qa_skip=args.qa_skip,
                             qa_fraction=args.qa_fraction if args.qa_fraction is not None else DEFAULT_QA_FRACTION if args.qa
                             else _TRAIN.qa_fraction,
                             sizes={**({"align_mode": args.align} if args.align else {}),
                                    **{name: getattr(args, name) for name in ("window", "width", "expert_hidden",
                                                                               "num_experts", "top_k")
                                       if getattr(args, name) is not None}},
                             **({"lr": args.lr} if args.lr is not None else {}))
    out = train_translator(source=args.source, target=args.target, corpus=args.corpus, steps=args.steps,
                           out=args.out, kind=args.kind, work_dir=args.work_dir, settings=settings, init=args.init)
    print(f"wrote {out}")
    return 0


def run_score(args) -> int:
    from cagkit.translate.train import score_translator

    for checkpoint in args.checkpoints:
        heldout = score_translator(checkpoint, corpus=args.corpus)
        recall = heldout["recall"]
        print(f"{checkpoint}: next text {heldout['recovery']['translated']:.2f} / "
              f"{heldout['kl_recovery']['translated']:.2f}, recall {recall['recovery']['translated']:.2f} / "
              f"{recall['kl_recovery']['translated']:.2f} (loss / KL recovery); card updated")
    return 0


def run_answers(args) -> int:
    from pathlib import Path

    from cagkit.evaluation.report import translator_answers
    from cagkit.translate.cards import card_path, checkpoint_digest, read_card, write_card

    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_file():
        raise CagkitError(f"{checkpoint}: no such translator checkpoint; give a .safetensors file")
    card = read_card(checkpoint, "restore it before adding answers to it")
    entries = translator_answers(checkpoint_digest(checkpoint), [Path(p) for p in args.results])
    replaced = {(e["results"], e["method"]) for e in entries}
    card["answers"] = [e for e in card.get("answers", []) if (e["results"], e["method"]) not in replaced] + entries
    write_card(checkpoint, card)
    for e in entries:
        quality = f"F1 {e['f1']:.3f}" if "f1" in e else f"accuracy {e['accuracy']:.3f}"
        against = "; ".join(f"− {name} {d['mean']:+.3f} ({d['low']:+.3f} to {d['high']:+.3f})"
                            for name, d in e["against"].items())
        gap = f"; {_share(e['gap_closed'])} of the none → oracle gap" if "gap_closed" in e else ""
        if native := e.get("native_gap_closed"):
            gap += f"; {_share(native)} of native's lead over {native['over']}"
        print(f"{e['data']} {e['method']} ({e['placement']}, {e['questions']} q): {quality}; {against}{gap}")
    print(f"{card_path(checkpoint)}: {len(entries)} answer record(s) written")
    return 0


def _share(found: dict) -> str:
    """A share of a gap closed, with its interval where the record has one (cards written before had none)."""
    interval = f" ({found['low']:.0%} to {found['high']:.0%})" if "low" in found else ""
    return f"{found['share']:.0%}{interval}"


def run_list(args) -> int:
    from cagkit.translate.cards import NEAR_NATIVE, list_translators, translators_dir

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
          f"near native (next text {NEAR_NATIVE:.0%})")
    for r in rows:
        tokens = f"{r['training_tokens'] / 1000:.1f}k" if r["training_tokens"] else "-"
        print(f"{r['source']:<8} {r['target']:<8} {r['kind']:<9} {r['steps'] if r['steps'] is not None else '-':>5} "
              f"{tokens:>7}  {score(r['next_loss'], r['next_kl']):>11}  {score(r['recall_loss'], r['recall_kl']):>11}  "
              f"{r['near_native']}")
    print("held-out recovery, loss / KL: the share of the no-context -> native gap the translated context closes")
    return 0
