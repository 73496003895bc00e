"""Who may act in which namespace: the authorisation hook's values, bearer tokens, the namespace header.

The HTTP app asks one *authorizer* per request, before it reads the body or
calls the service: a callable that gets an :class:`AuthRequest` (the
namespace, the headers, the method and the path) and returns a
:class:`Principal`, or raises :class:`AuthenticationError` (answered 401) or
:class:`NamespaceForbiddenError` (answered 403).  :class:`BearerTokens` is
one authorizer: the grants of a token file, each a token's SHA-256 and the
namespaces it may act in.

Why SHA-256 and not a slow password hash: a token is 32 random bytes
(:func:`mint_token`), so its hash cannot be reversed by guessing; a slow KDF
protects low-entropy passwords, which tokens are not.  The presented token's
hash is compared with every grant's by :func:`hmac.compare_digest`, with no
early exit, so the time taken says nothing about which bytes matched.

Non-ASCII namespaces travel percent-encoded (UTF-8) in ``X-Namespace``
(:func:`encode_namespace`, :func:`decode_namespace`); raw bytes above 0x7F
are refused rather than read as Latin-1, which would file a tenant's
commands under another name.

Pure: no I/O, no clock; randomness is a parameter of :func:`mint_token`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeAlias
from urllib.parse import quote, unquote_to_bytes

from admission.errors import AdmissionError, InvalidValueError

__all__ = [
    "DEFAULT_NAMESPACE",
    "NAMESPACE_HEADER",
    "TOKEN_FILE_VERSION",
    "TOKEN_PREFIX",
    "WILDCARD",
    "AccessError",
    "AuthRequest",
    "AuthenticationError",
    "Authorizer",
    "BearerTokens",
    "NamespaceForbiddenError",
    "Principal",
    "TokenFileError",
    "TokenGrant",
    "decode_namespace",
    "encode_namespace",
    "mint_token",
    "token_digest",
]

NAMESPACE_HEADER: Final = "X-Namespace"
"""The header that names the namespace (the isolation boundary, contract §2.6), percent-encoded UTF-8."""
DEFAULT_NAMESPACE: Final = "default"
"""The namespace of a request without :data:`NAMESPACE_HEADER`."""
TOKEN_PREFIX: Final = "adm_"
"""The prefix of a minted token: it makes a leaked token easy to recognise (and to scan for)."""
TOKEN_BYTES: Final = 32
"""A minted token's random bytes: 256 bits, so its SHA-256 cannot be reversed by guessing."""
WILDCARD: Final = "*"
"""A grant's namespace that stands for every namespace (an operator's or a single-tenant engine's token)."""
TOKEN_FILE_VERSION: Final = 1
"""The ``version`` of the token file format this code reads and writes."""
MAX_NAME_LENGTH: Final = 255
"""The longest token name, in code points."""

_HEX64 = re.compile(r"[0-9a-f]{64}")
_LONE_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
# Printable ASCII except "%" passes through unencoded: a namespace that was
# valid before percent-decoding (and holds no "%") is sent unchanged.  A space
# is encoded too, so that no proxy trims it.
_HEADER_SAFE: Final = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# -- errors --------------------------------------------------------------------------------


class AccessError(AdmissionError):
    """A request was refused by the authorizer, before anything was read or written.

    ``status`` is the HTTP status it is answered with; retrying the same
    request cannot succeed.
    """

    code: ClassVar[str] = "access_denied"
    status: ClassVar[int] = 403


class AuthenticationError(AccessError):
    """The request carries no credentials the authorizer accepts: HTTP 401 with ``WWW-Authenticate``.

    ``invalid`` is true when credentials were sent but are not valid (RFC 6750
    §3.1 ``invalid_token``), false when none were sent.
    """

    code: ClassVar[str] = "unauthenticated"
    status: ClassVar[int] = 401

    def __init__(self, message: str, *, invalid: bool = False) -> None:
        super().__init__(message)
        self.invalid = invalid


class NamespaceForbiddenError(AccessError):
    """The credentials are valid but not for this namespace: HTTP 403."""

    code: ClassVar[str] = "namespace_forbidden"
    status: ClassVar[int] = 403

    def __init__(self, message: str, *, namespace: str, principal: str | None = None) -> None:
        super().__init__(message)
        self.namespace = namespace
        self.principal = principal


class TokenFileError(AdmissionError, ValueError):
    """A token file cannot be used; ``field`` names the place (``tokens[2].sha256``), never a value."""

    code: ClassVar[str] = "token_file_invalid"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# -- the hook's values ---------------------------------------------------------------------


@dataclass(frozen=True)
class AuthRequest:
    """What an authorizer sees of a request: the decoded namespace, the headers, method and path.

    ``headers`` is the request's header mapping (the app gives a
    case-insensitive one; its ``get`` returns the first value of a header).
    ``path`` is the route's path inside the app (without the prefix it is
    mounted under).
    """

    namespace: str
    headers: Mapping[str, str]
    method: str = "POST"
    path: str = "/"

    def bearer_token(self) -> str | None:
        """The token of ``Authorization: Bearer <token>`` (RFC 6750 §2.1), else ``None``."""
        value = self.headers.get("authorization")
        if value is None:
            value = self.headers.get("Authorization")
        if value is None:
            return None
        scheme, _, token = value.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or " " in token:
            return None
        return token


@dataclass(frozen=True)
class Principal:
    """Who an authorizer let in: a name for the engine's own use (never a secret)."""

    name: str


Authorizer: TypeAlias = Callable[[AuthRequest], "Principal | Awaitable[Principal]"]
"""The authorisation hook of ``create_app``: returns (or awaits to) a :class:`Principal`, or raises
:class:`AuthenticationError` (401) or :class:`NamespaceForbiddenError` (403).  Any other exception
is a 500 and the request is refused (it fails closed).  A plain function runs on the event loop, so
it must not block; do blocking work in an ``async`` one (off the loop)."""


# -- tokens --------------------------------------------------------------------------------


def mint_token(random_bytes: Callable[[int], bytes]) -> str:
    """A new bearer token: ``adm_`` + 64 hex digits of ``random_bytes(32)`` (give ``secrets.token_bytes``)."""
    data = random_bytes(TOKEN_BYTES)
    if len(data) != TOKEN_BYTES:
        raise ValueError(f"random_bytes({TOKEN_BYTES}) returned {len(data)} bytes")
    return TOKEN_PREFIX + data.hex()


def token_digest(token: str) -> str:
    """The lowercase hex SHA-256 of the token's UTF-8 bytes: what a token file stores."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class TokenGrant:
    """One line of a token file: the token's name, its SHA-256, the namespaces it may act in.

    A namespace ``*`` (:data:`WILDCARD`) grants every namespace.
    """

    name: str
    sha256: str
    namespaces: tuple[str, ...]

    def allows(self, namespace: str) -> bool:
        """Whether this grant lets its token act in ``namespace``."""
        return WILDCARD in self.namespaces or namespace in self.namespaces

    def to_dict(self) -> dict[str, object]:
        """The grant as the token file writes it."""
        return {"name": self.name, "sha256": self.sha256, "namespaces": list(self.namespaces)}


class BearerTokens:
    """An authorizer over the grants of a token file (``docs/http.md``, "Authentication").

    Call it with an :class:`AuthRequest`: no bearer token or an unknown one
    raises :class:`AuthenticationError`; a known token used outside its
    namespaces raises :class:`NamespaceForbiddenError`; otherwise it returns
    the grant's :class:`Principal`.
    """

    def __init__(self, grants: Iterable[TokenGrant] = ()) -> None:
        self.grants: tuple[TokenGrant, ...] = tuple(grants)
        names: set[str] = set()
        digests: set[str] = set()
        for index, grant in enumerate(self.grants):
            _check_grant(grant, f"tokens[{index}]")
            if grant.name in names:
                raise TokenFileError(f"tokens[{index}].name", f"{grant.name!r} is used twice")
            if grant.sha256 in digests:
                raise TokenFileError(f"tokens[{index}].sha256", "the same token hash is listed twice")
            names.add(grant.name)
            digests.add(grant.sha256)

    @classmethod
    def from_json(cls, text: str) -> BearerTokens:
        """The grants of a token file's text; :class:`TokenFileError` names what is wrong, never a value.

        The format: ``{"version": 1, "tokens": [{"name": "engine-a", "sha256":
        "<64 lowercase hex>", "namespaces": ["a", "b"]}]}`` (``version`` may be
        left out; no other member is accepted).
        """
        try:
            data = json.loads(text, object_pairs_hook=_refuse_duplicates)
        except _DuplicateKeyError as exc:
            raise TokenFileError("file", f"member {exc.key!r} appears twice in one object") from None
        except json.JSONDecodeError as exc:
            # Its own message quotes no text, only a position.
            where = f"line {exc.lineno} column {exc.colno}"
            raise TokenFileError("file", f"not JSON: {exc.msg} at {where}") from None
        except (ValueError, RecursionError):
            raise TokenFileError("file", "not JSON (nested too deeply)") from None
        if not isinstance(data, dict):
            raise TokenFileError("file", "must be a JSON object with a 'tokens' list")
        unknown = sorted(set(data) - {"version", "tokens"})
        if unknown:
            raise TokenFileError(unknown[0], "unknown member (expected 'version' and 'tokens')")
        version = data.get("version", TOKEN_FILE_VERSION)
        if type(version) is not int or version != TOKEN_FILE_VERSION:
            raise TokenFileError("version", f"must be {TOKEN_FILE_VERSION}")
        entries = data.get("tokens")
        if not isinstance(entries, list):
            raise TokenFileError("tokens", "must be a list")
        return cls(_grant_from(entry, f"tokens[{index}]") for index, entry in enumerate(entries))

    def to_json(self) -> str:
        """The token file's text for these grants (what :meth:`from_json` reads back)."""
        payload = {"version": TOKEN_FILE_VERSION, "tokens": [g.to_dict() for g in self.grants]}
        return json.dumps(payload, indent=2, ensure_ascii=False) + "\n"

    def with_grant(self, grant: TokenGrant) -> BearerTokens:
        """These grants and ``grant`` (a name or hash already listed is :class:`TokenFileError`)."""
        return BearerTokens((*self.grants, grant))

    def without(self, name: str) -> BearerTokens:
        """These grants without the one named ``name`` (:class:`TokenFileError` if there is none)."""
        kept = tuple(g for g in self.grants if g.name != name)
        if len(kept) == len(self.grants):
            raise TokenFileError("--name", f"no token named {name!r}")
        return BearerTokens(kept)

    def grant_for(self, token: str) -> TokenGrant | None:
        """The grant whose hash is the token's, compared in constant time with every grant."""
        presented = token_digest(token)
        found: TokenGrant | None = None
        for grant in self.grants:
            # No early exit: every grant is compared, whichever matches.
            if hmac.compare_digest(grant.sha256, presented) and found is None:
                found = grant
        return found

    def __call__(self, request: AuthRequest) -> Principal:
        """Authorise ``request``: its bearer token must be listed and granted its namespace."""
        token = request.bearer_token()
        if token is None:
            raise AuthenticationError("a bearer token is required: send 'Authorization: Bearer <token>'")
        grant = self.grant_for(token)
        if grant is None:
            raise AuthenticationError("the bearer token is not valid", invalid=True)
        if not grant.allows(request.namespace):
            raise NamespaceForbiddenError(
                f"token {grant.name!r} is not granted namespace {request.namespace!r}",
                namespace=request.namespace,
                principal=grant.name,
            )
        return Principal(grant.name)


class _DuplicateKeyError(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKeyError(key)
        result[key] = value
    return result


def _grant_from(entry: object, where: str) -> TokenGrant:
    if not isinstance(entry, dict):
        raise TokenFileError(where, "must be an object with 'name', 'sha256' and 'namespaces'")
    for member in ("name", "sha256", "namespaces"):
        if member not in entry:
            raise TokenFileError(f"{where}.{member}", "is missing")
    unknown = sorted(set(entry) - {"name", "sha256", "namespaces"})
    if unknown:
        # A token written here in clear by mistake is named by its member, never shown.
        raise TokenFileError(f"{where}.{unknown[0]}", "unknown member (expected name, sha256, namespaces)")
    namespaces = entry["namespaces"]
    if not isinstance(namespaces, list):
        raise TokenFileError(f"{where}.namespaces", "must be a list of namespaces")
    grant = TokenGrant(entry["name"], entry["sha256"], tuple(namespaces))
    _check_grant(grant, where)
    return grant


def _check_grant(grant: TokenGrant, where: str) -> None:
    name = grant.name
    if type(name) is not str or not name or len(name) > MAX_NAME_LENGTH or _CONTROL.search(name):
        raise TokenFileError(
            f"{where}.name", f"must be 1 to {MAX_NAME_LENGTH} characters without control characters"
        )
    if type(grant.sha256) is not str or not _HEX64.fullmatch(grant.sha256):
        raise TokenFileError(f"{where}.sha256", "must be 64 lowercase hex digits (the token's SHA-256)")
    if not grant.namespaces:
        raise TokenFileError(f"{where}.namespaces", "must grant at least one namespace")
    seen: set[str] = set()
    for index, namespace in enumerate(grant.namespaces):
        if type(namespace) is not str or not namespace:
            raise TokenFileError(f"{where}.namespaces[{index}]", "must be a non-empty string")
        if namespace in seen:
            raise TokenFileError(f"{where}.namespaces[{index}]", f"{namespace!r} is listed twice")
        seen.add(namespace)


# -- the namespace header ------------------------------------------------------------------


def encode_namespace(namespace: str) -> str:
    """``namespace`` as it travels in ``X-Namespace``: UTF-8, percent-encoded outside printable ASCII.

    ``%`` and space are encoded too; any other printable ASCII character is
    sent as itself, so an ASCII namespace without them is unchanged.
    """
    return quote(namespace, safe=_HEADER_SAFE, encoding="utf-8", errors="strict")


def decode_namespace(
    values: Sequence[bytes], default: str = DEFAULT_NAMESPACE, *, header: str = NAMESPACE_HEADER
) -> str:
    """The namespace that the raw values of its header name; ``default`` when the header is absent.

    Refused with :class:`~admission.errors.InvalidValueError` (``field
    "namespace"``, the message naming the header): the header sent twice, a
    raw byte above 0x7F (it would be read as Latin-1), a ``%`` not followed by
    two hex digits, and percent-encoded bytes that are not UTF-8.
    """
    if not values:
        return default
    if len(values) > 1:
        raise _namespace_error(f"the {header} header is sent {len(values)} times; send it once")
    raw = values[0]
    if not raw.isascii():
        raise _namespace_error(
            f"the {header} header holds raw non-ASCII bytes; send the namespace's UTF-8 "
            "percent-encoded (über is %C3%BCber)"
        )
    text = raw.decode("ascii")
    if _LONE_PERCENT.search(text):
        raise _namespace_error(f"the {header} header has a '%' that starts no %XX escape (a '%' is %25)")
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        raise _namespace_error(f"the {header} header percent-encodes bytes that are not UTF-8") from None


def _namespace_error(reason: str) -> InvalidValueError:
    return InvalidValueError(reason, field="namespace", path="")
