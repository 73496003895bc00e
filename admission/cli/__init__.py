"""The ``admission`` command line."""

from admission.cli._worker import build_parser, main

__all__ = ["build_parser", "main"]
