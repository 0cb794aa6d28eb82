"""The `cagkit` command: a thin layer over the library, one function per command."""

from cagkit.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
