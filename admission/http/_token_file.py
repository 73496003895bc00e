"""Reading a token file from disk: the one I/O of bearer tokens (the format is ``_tokens``, pure).

Kept apart from the app so that ``admission token`` reads and checks a file
without the ``http`` extra.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from admission.http._tokens import BearerTokens, TokenFileError

__all__ = ["MAX_TOKEN_FILE_BYTES", "read_token_file"]

MAX_TOKEN_FILE_BYTES: Final = 16 * 1024 * 1024
"""The largest token file read: far more than any real list of grants."""


def read_token_file(path: str | os.PathLike[str]) -> BearerTokens:
    """The :class:`BearerTokens` of the token file at ``path``.

    Refused with :class:`TokenFileError` (its message names the place, never
    a hash or a token): a file that cannot be read, is not a regular file, is
    writable by its group or by others (anyone who can write it can grant
    themselves a namespace), is larger than :data:`MAX_TOKEN_FILE_BYTES`, is
    not UTF-8, or is not a valid token file.
    """
    try:
        with Path(path).open("rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise TokenFileError("file", f"{os.fspath(path)} is not a regular file")
            if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                raise TokenFileError(
                    "file", f"{os.fspath(path)} is writable by its group or others (chmod 600 it)"
                )
            data = handle.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise TokenFileError("file", f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    if len(data) > MAX_TOKEN_FILE_BYTES:
        raise TokenFileError("file", f"larger than {MAX_TOKEN_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenFileError("file", f"not UTF-8 text (byte {exc.start})") from None
    return BearerTokens.from_json(text)
