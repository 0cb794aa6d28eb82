"""The named choices and defaults that the library uses and the command line offers, kept apart from the
modules that use them because this one imports nothing: `cagkit --help` and a mistyped option answer without
loading PyTorch and transformers (about 2.5 s on 2 cores)."""

from pathlib import Path

ALIGN_MODES = ("cover", "overlap")  # cagkit.alignment: how a target token reads the source tokens
ASK_MODES = ("mot", "native", "linear", "projector", "oracle")  # cagkit.ask: where the target's context KV comes from
# cagkit.evaluation.runner: what `cagkit eval --methods` compares (none: no context; source: the source model answers)
EVAL_METHODS = ("native", "none", "source", "linear", "projector", "mot", "oracle")
TRANSLATOR_KINDS = ("mot", "projector", "linear")  # cagkit.translators
EXPERT_INPUTS = ("trunk", "depth")  # cagkit.translators: what each MoT expert reads
# cagkit.retrieval: how chunks are ranked for a question (hybrid: embedding and BM25 rankings fused)
RETRIEVAL_MODES = ("hybrid", "dense", "lexical")
DEFAULT_RETRIEVAL = "hybrid"
KV_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4}  # cagkit.store: the dtypes stored KV may take, and their bytes

# most source tokens per stored chunk; 256 keeps a chunk, once translated, well inside Gemma 3's 512-token
# sliding window
DEFAULT_CHUNK_TOKENS = 256
DEFAULT_SOURCE = "smollm2"  # the model that prefills the documents at ingest
DEFAULT_STORE = Path("stores/default")
