"""`cagkit bench`: the first-token benchmark against document length (`cagkit.evaluation.first_token`)."""

from __future__ import annotations

from cagkit.cli.options import add_device_options
from cagkit.config import KV_DTYPES, TRANSLATOR_KINDS


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="time the first token against document length: native, stored, select, "
                                     "torch.save",
                       description="For each size, the opening of a text (cut at a sentence end) is ingested by "
                                   "--model itself and four ways to the first token of one question run side by "
                                   "side: native prefill, the stored document cache, the select control and a "
                                   "torch.save'd transformers cache. Writes a results file, a plot and a Markdown "
                                   "table, and prints the table. Times compare within one file only.")
    p.add_argument("--model", required=True, help="the model that writes the store and answers, e.g. qwen-1.5b")
    p.add_argument("--sizes", default="1024,4096,16384", help="document tokens, comma-separated (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3,
                   help="measured rounds per size, after one warm-up round (default: %(default)s)")
    p.add_argument("--no-native-warm-up", dest="native_warm_up", action="store_false",
                   help="leave native out of the warm-up round (the other three run the same model code, so the "
                        "process is warm); for sizes where one native prefill takes many minutes")
    p.add_argument("--text", default=None,
                   help="the text to cut the documents from (default: $CAGKIT_DATA/corpus/gutenberg/testing/"
                        "chesterton-brown.txt, $CAGKIT_DATA defaulting to ../shared/data)")
    p.add_argument("--question", default=None,
                   help="the question asked of every document (default: one about the default text's opening)")
    p.add_argument("--dtype", default="float16", choices=list(KV_DTYPES),
                   help="the KV dtype of that store (`cagkit ingest --dtype`; default: %(default)s)")
    p.add_argument("--store", default=None,
                   help="the store the documents go to (default: results/stores/bench/<model>[-<dtype>])")
    p.add_argument("--source", default=None,
                   help="another model that ingests each document too: a fifth way, its stored KV translated into "
                        "--model and placed whole, is timed beside the four (translation included)")
    p.add_argument("--translator", default="mot", choices=list(TRANSLATOR_KINDS),
                   help="with --source, the translator kind that reads its store (default: %(default)s; "
                        "$CAGKIT_TRANSLATORS names another folder of checkpoints)")
    p.add_argument("--source-store", default=None,
                   help="with --source, the store its documents go to (default: results/stores/bench/<source>"
                        "[-<dtype>])")
    p.add_argument("--out", default=None, help="results JSON, resumed if it exists (default: results/bench-<model>.json)")
    p.add_argument("--plot", default=None, help="PNG to draw (default: results/bench-<model>.png; '' for none)")
    p.add_argument("--report", default=None,
                   help="Markdown table to write (default: results/bench-<model>.md; '' for none)")
    p.add_argument("--replot", action="store_true",
                   help="only print the table and rewrite --plot and --report from --out; no model loads")
    add_device_options(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from cagkit.evaluation import first_token

    if args.question is None:
        args.question = first_token.DEFAULT_QUESTION
    first_token.bench(args)
    return 0
