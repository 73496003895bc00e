# Stub for the optional C extension admission/intent/_speedups.c.

def encode(value: object, limit: int, /) -> bytes | None:
    """The canonical intent-v1 encoding of ``value``, or None if it is refused.

    None means the pure-Python encoder refuses ``value`` too: re-run it for the
    error.  ``limit`` is the most bytes the encoding may take.
    """
