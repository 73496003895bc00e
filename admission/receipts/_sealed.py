"""Arguments admitted by their plaintext and stored in another form (contract §3).

When a payload codec encrypts the arguments, the intent digest is computed
over the decoded plaintext (contract §3), but the database need not keep
that plaintext: :class:`SealedArguments` carries both, the plaintext for the
digest and a text (the encrypted envelope as received) for the commands
table.  The service digests the plaintext, stores the text, and keeps
nothing else of the plaintext.

The stored form is the canonical encoding of a *text*.  Arguments are always
a list or a map (contract §3), so a reader of ``workflow_commands.arguments``
tells the two forms apart by the decoded type alone, and a caller cannot
make plaintext arguments look sealed.

Pure: no I/O, no clock, no SQLAlchemy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from admission.errors import InvalidValueError
from admission.intent._encoding import EncodedIntent, Value, canonical_encode, encode_intent

__all__ = ["SealedArguments", "envelope_text", "intent_and_stored", "is_envelope_text", "sealed_max_size"]


def sealed_max_size(max_size: int) -> int:
    """The largest stored form, in bytes, next to arguments bounded by ``max_size``.

    Twice the arguments' bound plus 4 KiB: base64 of the ciphertext of
    ``max_size`` bytes (a third more, with the nonce and tag) and the
    envelope's JSON around it fit within it.
    """
    return 2 * max_size + 4096


@dataclass(frozen=True, repr=False)
class SealedArguments:
    """Arguments to admit by ``arguments`` (the plaintext) and to store as ``stored``.

    ``arguments`` is the decoded plaintext, a list or a map: the intent digest
    and the arguments digest are computed over it, so a retry that sends the
    same plaintext under a new nonce is retained and one with other plaintext
    is a conflict.  ``stored`` is the text the commands table keeps instead of
    the arguments (the HTTP adapter puts the envelope as received there).
    Passed to ``AdmissionService.admit_signal`` / ``admit_update`` in place of
    the arguments.  Its ``repr`` never shows either value.
    """

    arguments: Value
    stored: str

    def __repr__(self) -> str:
        # Never the plaintext (it may be a card number), nor the sealed form.
        return f"SealedArguments(<{type(self.arguments).__name__}>, stored=<{len(self.stored)} chars>)"


def envelope_text(codec: str, blob: str) -> str:
    """The text a sealed command stores: the envelope ``{"codec", "blob"}`` as JSON, keys sorted,
    no spaces (the HTTP adapter's ``store_arguments="envelope"``)."""
    return json.dumps(
        {"codec": codec, "blob": blob}, ensure_ascii=False, separators=(",", ":"), sort_keys=True
    )


def is_envelope_text(text: str) -> bool:
    """Whether ``text`` is exactly what :func:`envelope_text` makes of some codec and blob."""
    try:
        members = json.loads(text)
    except ValueError:
        return False
    if not isinstance(members, dict) or set(members) != {"blob", "codec"}:
        return False
    codec, blob = members["codec"], members["blob"]
    return isinstance(codec, str) and isinstance(blob, str) and text == envelope_text(codec, blob)


def _stored_bytes(stored: object, max_size: int) -> bytes:
    if type(stored) is not str or not stored:
        raise InvalidValueError("the stored form must be a non-empty str", field="arguments", path="")
    # canonical_encode refuses a lone surrogate with a typed error naming the
    # field, before the transaction, on every backend alike.
    try:
        return canonical_encode(stored, max_size=sealed_max_size(max_size))
    except InvalidValueError as exc:
        raise InvalidValueError(f"stored form: {exc.reason}", field="arguments", path="") from None


def intent_and_stored(
    command_type: str, name: str, arguments: object, target: str | None, max_size: int
) -> tuple[EncodedIntent, bytes]:
    """The encoded intent of a command, and the bytes its ``arguments`` column keeps.

    Plain arguments are stored as their canonical encoding; for
    :class:`SealedArguments` the digests are over the plaintext and the
    stored bytes are the canonical encoding of the sealed text.  Every
    refusal is an :class:`InvalidValueError` raised before any write.
    """
    if isinstance(arguments, SealedArguments):
        encoded = encode_intent(command_type, name, arguments.arguments, target, max_size=max_size)
        return encoded, _stored_bytes(arguments.stored, max_size)
    encoded = encode_intent(command_type, name, arguments, target, max_size=max_size)
    return encoded, encoded.arguments
