"""The `cagkit` command: a thin layer over the library; each command calls one library function.

Each command group is a module here with `add_parser(subparsers)` and the function it runs; this module builds the
top-level parser and runs a command with threads, quiet libraries and one-line errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from cagkit import __version__
from cagkit.cli import ask, bench, eval, ingest, models, serve, store, translators
from cagkit.config import Placement
from cagkit.errors import CagkitError

DESCRIPTION = """Cache-augmented generation over long documents: prefill documents once with a cheap source model,
keep the KV cache in a store, and answer with any target model from translated caches."""

# in the order `cagkit --help` lists them
COMMANDS = (ingest, ask, serve, store, models, translators, eval, bench)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cagkit", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"cagkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


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
            blend = Placement.blend if args.blend is None else args.blend
            Placement(args.recompute_layers, blend, args.blend_select).check()
        if hasattr(args, "scope"):
            from cagkit.config import SCOPES

            if args.scope not in SCOPES:
                raise CagkitError(f"unknown --scope '{args.scope}'; use one of {', '.join(SCOPES)}")
        return args.func(args)
    except CagkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted; what was finished is kept (re-run to continue)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (`cagkit store info | head -1`): not an error of ours
        try:  # so that flushing stdout at exit does not fail again
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # stdout is not a file (replaced by a caller)
            pass
        return 141  # as a shell reports a command ended by SIGPIPE

