"""The command line's logging and its version line: the library's loggers configured here, and only here.

The library logs on ``admission.*`` loggers and configures nothing
(:mod:`admission.telemetry`).  The command sends those lines to stderr at the
level of ``--log-level`` (before the command) or ``ADMISSION_LOG_LEVEL``; with
neither, it configures nothing and they go nowhere, so every failure stays
one line on stderr (docs/observability.md).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Final

from admission import __version__
from admission.cli._common import ENV_DB, UsageError, mask_secrets
from admission.intent import ACCELERATED
from admission.telemetry import ROOT_LOGGER

__all__ = [
    "ENV_LOG_LEVEL", "ENV_PURE_PYTHON", "LOG_LEVELS", "accelerator_state", "configure_logging", "log_command",
    "version_line",
]  # fmt: skip

ENV_LOG_LEVEL: Final = "ADMISSION_LOG_LEVEL"
"""The level of admission's log lines on stderr when ``--log-level`` is not given."""

ENV_PURE_PYTHON: Final = "ADMISSION_PURE_PYTHON"
"""Set (to anything but ``""`` or ``"0"``), the C accelerator refuses to load (admission.intent)."""

LOG_LEVELS: Final = ("debug", "info", "warning", "error")
"""The levels ``--log-level`` takes."""

_log: Final = logging.getLogger(f"{ROOT_LOGGER}.cli")

_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _MaskingFormatter(logging.Formatter):
    """The usual line, with every URL's password masked: a second guard behind the loggers' own care."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))


def configure_logging(option: str | None) -> None:
    """Send admission's log lines to stderr at ``option`` (else ``$ADMISSION_LOG_LEVEL``; neither: none)."""
    if option is not None:
        field, value = "--log-level", option
    else:
        field, value = ENV_LOG_LEVEL, os.environ.get(ENV_LOG_LEVEL, "")
    if not value:
        return
    if value.lower() not in LOG_LEVELS:
        raise UsageError(field, f"must be one of {', '.join(LOG_LEVELS)}")
    handler = logging.StreamHandler()
    handler.setFormatter(_MaskingFormatter(_FORMAT))
    root = logging.getLogger(ROOT_LOGGER)
    root.addHandler(handler)
    root.setLevel(value.upper())
    _log.debug("log lines from %s on (%s)", value.lower(), field)


def log_command(args: argparse.Namespace) -> None:
    """A DEBUG line naming the command and its database (the URL's password masked)."""
    if not _log.isEnabledFor(logging.DEBUG):
        return
    url = getattr(args, "db", None) or os.environ.get(ENV_DB)
    _log.debug("command %s, database %s", args.command, mask_secrets(url) if url else "the default")


def accelerator_state() -> str:
    """Whether the C accelerator encodes: ``active``, turned off by the environment, or not built."""
    if ACCELERATED:
        return "active"
    if os.environ.get(ENV_PURE_PYTHON, "") not in ("", "0"):
        return f"off ({ENV_PURE_PYTHON}), pure Python"
    return "not built, pure Python"


def version_line() -> str:
    """What ``admission --version`` prints: ``admission 0.1.0 (C accelerator: active)``."""
    return f"admission {__version__} (C accelerator: {accelerator_state()})"
