"""Options that several commands share: the store, where models run, retrieval and chunk placement."""

from __future__ import annotations

import argparse
import os

from cagkit.config import (
    BLEND_SELECT,
    DEFAULT_RETRIEVAL,
    DEFAULT_SCOPE,
    DEFAULT_STORE,
    DOCUMENT_BUDGET,
    RETRIEVAL_MODES,
    SCOPES,
    Placement,
)


def add_store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=os.environ.get("CAGKIT_STORE", str(DEFAULT_STORE)),
                   help="store directory (default: %(default)s, or $CAGKIT_STORE)")


def add_retrieval_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--retrieval", default=DEFAULT_RETRIEVAL, choices=RETRIEVAL_MODES,
                   help="how chunks are ranked for the question: hybrid (the embedding's and BM25's rankings fused "
                        "by reciprocal rank), dense (the embedding alone) or lexical (BM25 alone) (default: "
                        "%(default)s)")


def add_placement_options(p: argparse.ArgumentParser) -> None:
    """The ask-time speed/quality options (`cagkit.config.Placement`), shared by ask and eval."""
    p.add_argument("--recompute-layers", type=int, default=Placement.recompute_layers, metavar="K",
                   help="translated modes: the target recomputes its bottom K layers over each chunk (about K/L of "
                        "a native prefill) and only the layers above are translated (default: %(default)s)")
    p.add_argument("--blend", type=float, default=None, metavar="R",
                   help="recompute this share of the context tokens with attention across all placed chunks, which "
                        "chunks or documents stored apart never had (0 to 1; 0 places them as stored, the fastest; "
                        f"1 is a joint prefill; default: 0 at document scope, {Placement.blend:g} for chunks and "
                        "for select, whose share of the context it is)")
    p.add_argument("--blend-select", default=Placement.blend_select, metavar="{" + ",".join(BLEND_SELECT) + "}",
                   help="which tokens --blend recomputes: whole sentences, most similar to the question first "
                        "(question), or those whose KV deviates most from a joint prefill of the bottom layers "
                        "(deviation, CacheBlend's choice) (default: %(default)s)")


def add_scope_option(p: argparse.ArgumentParser) -> None:
    """--scope, shared by ask and eval."""
    p.add_argument("--scope", default=DEFAULT_SCOPE, metavar="{" + ",".join(SCOPES) + "}",
                   help="what the target reads: the retrieved chunks' documents, each whole (document), the "
                        "retrieved chunks (chunks), or, for the modes that place stored KV, documents when they fit "
                        f"the target's context and {DOCUMENT_BUDGET} tokens, chunks otherwise and for select and "
                        "native (auto) (default: %(default)s)")


def add_device_options(p: argparse.ArgumentParser) -> None:
    """--device and --threads; `cagkit.cli.main` applies them before the command runs."""
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="where the models run: auto (CUDA when PyTorch sees a GPU, else the CPU), cpu, cuda or "
                        "cuda:N (default: $CAGKIT_DEVICE, else auto)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for the models (default: $CAGKIT_THREADS, else $OMP_NUM_THREADS, else "
                        "PyTorch's default of one per core); on a machine other jobs keep busy, fewer run faster")
