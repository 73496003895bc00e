"""The ``admission`` command line."""

from admission.cli._main import build_parser, main

__all__ = ["build_parser", "main"]
