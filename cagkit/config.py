"""One configuration centre: every named choice and default that the library uses and the command line offers.

The CLI reads its defaults and help text from here, so a default is written once. This module imports nothing
heavy: `cagkit --help` and a mistyped option answer without loading PyTorch and transformers (about 2.5 s on
2 cores).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from cagkit.errors import CagkitError

ALIGN_MODES = ("cover", "overlap")  # cagkit.translate.alignment: how a target token reads the source tokens
# cagkit.ask: where the target's context comes from (auto: `stored` where the store holds the target's own document
# caches, `select` elsewhere; `mot` is `stored` by its older name)
ASK_MODES = ("auto", "stored", "mot", "native", "linear", "projector", "oracle", "select")
# cagkit.evaluation.runner: what `cagkit eval --methods` compares (none: no context; source: the source model answers;
# select: the target prefills only the question's sentences, the control for every method that reads stored KV;
# mot-placed: the MoT's translated chunks placed as translated, no blend, whatever --blend says)
EVAL_METHODS = ("native", "none", "select", "source", "stored", "linear", "projector", "mot", "mot-placed", "oracle")
TRANSLATOR_KINDS = ("mot", "projector", "linear")  # cagkit.translate.translator
# cagkit.retrieval: how chunks are ranked for a question (hybrid: embedding and BM25 rankings fused)
RETRIEVAL_MODES = ("hybrid", "dense", "lexical")
DEFAULT_RETRIEVAL = "hybrid"
# cagkit.store: the dtypes stored KV may take, and their bytes per key or value; int8 and int4 are compressed
# (cagkit.kv.quant: keys per channel over 64 tokens, values per token over 64 channels, with a float16 scale and
# minimum per group: 4 bytes per 64 values; int4 adds a second code to a few layers' keys, which
# cagkit.kv.quant.bytes_per_value counts for a given model)
KV_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1 + 4 / 64, "int4": 0.5 + 4 / 64}

# most source tokens per stored chunk; 256 keeps a chunk, once translated, well inside Gemma 3's 512-token
# sliding window
DEFAULT_CHUNK_TOKENS = 256
DEFAULT_SOURCE = "smollm2"  # the model that prefills the documents at ingest
# cagkit.ingest: how the source reads a document: `document` (causally from its start, each chunk's KV its slice of
# the document's cache) or `chunks` (each chunk alone, as stores before document caches were written)
PREFILL_KINDS = ("document", "chunks")
DEFAULT_PREFILL = "document"
DEFAULT_STORE = Path("stores/default")
DEFAULT_MODEL = "smollm2"  # the target `ask`, `eval` and the LlamaIndex classes answer with when none is named
DEFAULT_TOP_K = 4  # chunks retrieved for a question
DEFAULT_MAX_NEW_TOKENS = 64  # the longest answer, in tokens
# Answers never repeat a sequence of this many tokens: greedy decoding's loops are cut (cagkit.generation.next_token)
NO_REPEAT_NGRAM = 4
# where `ask` takes the target's context from: `select` (the question's sentences prefilled by the target, no stored
# KV read), because no other mode has answered both sooner and no worse beyond noise on the measured runs: not
# translated KV, and not the store's own model reading its stored documents whole, which equals native prefill of
# the whole document and answers sooner but scored below select on SQuAD's articles (docs/document-caches.md);
# `auto` picks `stored` where the store holds the target's own KV and `select` elsewhere
DEFAULT_MODE = "select"
# what `ask` places (cagkit.ask.choose_scope): whole documents, the retrieved chunks, or documents when they fit
SCOPES = ("auto", "document", "chunks")
DEFAULT_SCOPE = "auto"
# the most context tokens whole documents may take at `--scope auto` or `document` (also capped by the target's
# context less the prompt and the answer)
DOCUMENT_BUDGET = 32768
# `cagkit eval`: the methods compared when none are named, and the longest answer (QA answers are short spans)
DEFAULT_EVAL_METHODS = ("native", "none", "select", "source", "linear", "projector", "mot")
DEFAULT_EVAL_MAX_NEW_TOKENS = 24
BLEND_SELECT = ("question", "deviation")


@dataclass(frozen=True)
class Placement:
    """How stored or translated chunks become the target's context: the ask-time trade of speed for quality.

    recompute_layers: translated modes only: the target recomputes its bottom this many layers over each chunk
        alone (about this share of a native prefill) and only the layers above are translated.
    blend: the share of context tokens the target recomputes through every layer with attention over all the
        retrieved chunks (`cagkit.kv.repair`), after prefilling its bottom two layers over them jointly; it restores
        the cross-chunk attention that chunks stored one at a time never had. 0 = off, 1 = a joint prefill.
    blend_select: which tokens `blend` recomputes: `question` (whole sentences, most similar to the question
        first) or `deviation` (those whose layer-1 KV differs most from the joint prefill, as CacheBlend).
        (EPIC's `initial`, every piece's first tokens, lost to `deviation` on the joins and was removed, and so
        was `gradual`, CacheBlend's gradual filtering, no better than `deviation` at the same share; results files
        from before still name them: `describe` labels them.)

    The defaults (15% of the tokens, chosen by the question) are what the measurements in docs/placement.md
    support for question answering: without them translated chunks carry the gist but not the exact spans.
    """

    recompute_layers: int = 0
    blend: float = 0.15
    blend_select: str = "question"

    def check(self, lm=None) -> None:
        """Refuse options out of range (for `lm`, a `cagkit.models.LoadedModel`, when given: without it the
        upper bound of --recompute-layers is not checked)."""
        if self.recompute_layers < 0:
            raise CagkitError(f"--recompute-layers must be 0 or more, got {self.recompute_layers}")
        if lm is not None and self.recompute_layers > lm.num_layers:
            raise CagkitError(f"--recompute-layers must be between 0 and {lm.num_layers} for {lm.name}, "
                              f"got {self.recompute_layers}")
        if not 0.0 <= self.blend <= 1.0:
            raise CagkitError(f"--blend must be a share of the context tokens between 0 and 1, got {self.blend}")
        if self.blend_select not in BLEND_SELECT:
            raise CagkitError(f"--blend-select must be one of {', '.join(BLEND_SELECT)}, got '{self.blend_select}'")

    def settings(self) -> dict:
        """Every option, for a results file or an answer (explicit, so a later change of defaults cannot
        change what a recorded run means)."""
        return asdict(self)

    def effective(self) -> "Placement":
        """The same placement with the options that have no effect reset (which tokens a blend of 0 would pick),
        so that two runs that place chunks the same way compare equal."""
        return self if self.blend else replace(self, blend_select=AS_STORED.blend_select)

    def describe(self) -> str:
        """What this placement adds to placing the chunks as stored, for a label: '' or e.g. ', blend 0.15 by
        question'."""
        parts = []
        if self.recompute_layers:
            parts.append(f"recompute layers {self.recompute_layers}")
        if self.blend:
            parts.append(f"blend {self.blend:g}" + {"question": " by question",  # initial, gradual: removed rules
                                                     "initial": " at each piece's start",
                                                     "gradual": " narrowing"}.get(self.blend_select, ""))
        return "".join(f", {p}" for p in parts)

    def inert_fields(self) -> tuple[str, ...]:
        """The options that have no effect under this placement: which tokens a blend of 0 would pick."""
        return () if self.blend else ("blend_select",)

    def cli_args(self) -> list[str]:
        """The `cagkit ask` / `cagkit eval` options that reproduce this placement (those not at the default)."""
        default = Placement()
        changed = {k: v for k, v in asdict(self).items() if v != getattr(default, k)}
        for name in self.inert_fields():
            changed.pop(name, None)
        return [arg for k, v in changed.items()
                for arg in (f"--{k.replace('_', '-')}", f"{v:g}" if isinstance(v, float) else str(v))]

    @classmethod
    def from_settings(cls, settings: dict) -> "Placement":
        """The placement recorded in a results file's settings or an answer. Files written before every option
        was recorded left out the ones at their defaults of the time, when chunks were placed as stored."""
        return cls(**{**asdict(AS_STORED), **{f.name: settings[f.name] for f in fields(cls) if f.name in settings}})


# Chunks placed exactly as stored or translated: no recompute of any kind (the fastest placement).
AS_STORED = Placement(recompute_layers=0, blend=0.0, blend_select="deviation")
PLACEMENT_FIELDS = tuple(f.name for f in fields(Placement))


@dataclass(frozen=True)
class TranslatorSizes:
    """A translator's own sizes, as `cagkit translators train` builds it when no size option is given
    (`cagkit.translate.translator.TranslatorConfig` takes its defaults from `TRANSLATOR_SIZES`)."""

    native_layers: int = 1  # bottom target layers computed exactly from token embeddings (0 or 1)
    window: int = 3  # source layers per target layer, centred on the depth-matched one
    width: int = 160  # trunk width
    expert_hidden: int = 96  # hidden units of each expert MLP (the projector's one MLP gets twice as many)
    num_experts: int = 4
    top_k: int = 2  # experts the router picks per token
    token_dim: int = 128  # projected token-identity features
    skip_rank: int = 256  # rank of the linear skip from the source window (mot, projector)
    align_mode: str = "cover"  # how a target token reads the source tokens (ALIGN_MODES)


TRANSLATOR_SIZES = TranslatorSizes()
DEFAULT_QA_FRACTION = 0.5  # share of training examples with a question-answer continuation, given a QA file


@dataclass
class TrainSettings:
    """Everything that shapes a training run; recorded in the card."""

    steps: int = 600
    prefix_tokens: int = 128  # target tokens of each training example's translated prefix
    continuation_tokens: int = 32  # target tokens replayed for the Context Correction Loss
    # Share of examples whose continuation is a span copied from the prefix instead of the text that follows it:
    # replaying it natively needs recall from the context (as answering a question about it does), not only
    # the last few tokens, so CCL on it trains the keys the target's look-up heads match against.
    recall_fraction: float = 0.5
    examples: int = 200  # ~25k target tokens; on 2 busy cores about 15 min of paired prefill
    shard_size: int = 25
    batch: int = 4
    lr: float = 1e-3
    skip_lr_scale: float = 0.1
    warmup: int = 50
    kv_weight: float = 1.0
    kl_weight: float = 1.0
    hidden_weight: float = 1.0
    balance_weight: float = 0.01
    top_logits: int = 64
    # The CCL's logits KL. False: over the native top `top_logits` tokens, renormalised (mass the translated
    # context puts elsewhere is not seen). True: over the whole vocabulary, coarsened to those tokens plus one
    # bin for all the others, which is exact for that partition and needs the native log-partition per
    # position (stored with the data) and the target's full LM head on every replayed token.
    full_vocab_kl: bool = False
    ridge: float = 10.0
    checkpoint_every: int = 25
    heldout_examples: int = 20
    # Target tokens of each held-out passage's translated prefix: fixed apart from `prefix_tokens`, so cards of
    # runs trained on other prefix lengths are scored on the same passages and compare.
    heldout_prefix_tokens: int = 128
    heldout_seed: int = 0  # picks the held-out passages, apart from `seed`, so runs of other seeds compare too
    # Question-answer continuations: in a share `qa_fraction` of the examples the prefix is a passage of a
    # question-answering file `qa_data` (any format `cagkit eval` reads) that holds a question's answer, and the
    # continuation is the rest of the prompt `cagkit ask` gives the target for that question, then the answer
    # (padded to the continuation length and masked there),
    # so the CCL pulls the target's reading of a question and its answer over the translated passage towards
    # its native one. `qa_skip` leaves out the first N questions and every question on their documents, so a
    # run can train on a QA file whose first N questions `cagkit eval --limit N` scores.
    qa_data: str | None = None
    qa_format: str | None = None
    qa_fraction: float = 0.0
    qa_skip: int = 0
    seed: int = 0
    threads: int = 1
    sizes: dict = field(default_factory=dict)  # TranslatorConfig overrides (width, num_experts, align_mode...)
