"""Where golden vectors are read from: the folder that ships inside the package, or one the caller names.

The vectors are package data (``admission/intent/vectors/``), found through
:mod:`importlib.resources` rather than a path relative to the working
directory, so ``admission vectors verify`` works the same after a plain
``pip install`` as in a checkout.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = ["folder", "shipped_vectors"]


def shipped_vectors() -> Traversable:
    """The golden vectors installed with the package: the folder ``admission/intent/vectors/``.

    Found through :mod:`importlib.resources`, so it is the same folder from a
    wheel, an editable install or a checkout, whatever the working directory.
    :func:`~admission.intent.load_vectors` and
    :func:`~admission.intent.verify_vectors` read it when given no folder.  An
    installed package is files on disk, so ``str(shipped_vectors())`` is the
    folder to point a port in another language at.
    """
    return resources.files("admission.intent").joinpath("vectors")


def folder(location: str | os.PathLike[str] | Traversable | None) -> Traversable:
    """``location`` as a resource to read: None is the shipped vectors, a str or path is on disk.

    Anything else is a resource already (a ``zipfile.Path`` when the package
    is imported from a zip), read as it is.
    """
    if location is None:
        return shipped_vectors()
    if isinstance(location, str | os.PathLike):
        return Path(location)
    return location
