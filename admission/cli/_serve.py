"""``admission serve``: the HTTP API under uvicorn, with the AES-GCM key read from the environment.

With ``--tokens FILE`` (or ``$ADMISSION_TOKENS``) every request needs a
bearer token granted its namespace; without, only a loopback address may be
bound unless ``--insecure-no-auth`` says the open port is meant.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os

from admission.cli._common import (
    ENV_READ_DB,
    EXIT_OK,
    Commands,
    UsageError,
    db_url,
    open_async_service,
    read_db_url,
)
from admission.cli._token import ENV_TOKENS, load_tokens
from admission.http import BearerTokens, StoreArguments
from admission.http._limits import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_WAITS

__all__ = ["add_parser"]

ENV_AES_GCM_KEY = "ADMISSION_AES_GCM_KEY"
"""The server's AES-GCM key, standard base64 of 16, 24 or 32 bytes (docs/http.md); unset: no ``aes-gcm``."""
ENV_AES_GCM_KEY_ID = "ADMISSION_AES_GCM_KEY_ID"
"""The key's id, part of the associated data of every envelope (default: ``default``)."""


def _aes_gcm_key() -> tuple[bytes, str] | None:
    # The key comes from the environment, never the command line, where any
    # user of the machine could read it in the process list.
    text = os.environ.get(ENV_AES_GCM_KEY)
    if not text:
        return None
    import base64

    try:
        key = base64.b64decode(text.strip(), validate=True)
    except ValueError:  # binascii.Error, and text that is not ASCII at all
        raise UsageError(ENV_AES_GCM_KEY, "not standard base64") from None
    if len(key) not in (16, 24, 32):
        raise UsageError(ENV_AES_GCM_KEY, f"must decode to 16, 24 or 32 bytes, got {len(key)}")
    return key, os.environ.get(ENV_AES_GCM_KEY_ID) or "default"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def _authorizer(args: argparse.Namespace) -> BearerTokens | None:
    # Checked before the database is opened: a server that would listen
    # unprotected, or on a file it cannot use, never starts.
    path = args.tokens or os.environ.get(ENV_TOKENS)
    if path and args.insecure_no_auth:
        raise UsageError("--insecure-no-auth", "cannot be given with --tokens (or $ADMISSION_TOKENS)")
    if path:
        return load_tokens(path, "--tokens")
    if not args.insecure_no_auth and not _is_loopback(args.host):
        raise UsageError(
            "--host",
            f"{args.host} is not a loopback address, and without --tokens anyone who reaches the port "
            "could act in every namespace; give --tokens FILE (admission token create), "
            "or --insecure-no-auth if that is meant",
        )
    return None


def _http_parser() -> str:
    # uvicorn's own "auto" rule, made explicit so the line printed on start names what runs:
    # the C parser when installed (the http extra brings it), else the pure-Python h11.
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from admission.http import AesGcmCodec, CborCodec, Codec, JsonCodec, codecs_from, create_app
    except ImportError as exc:
        raise UsageError("serve", f"needs the http extra: pip install 'admission[http]' ({exc})") from None
    if not 0 < args.port < 65536:
        raise UsageError("--port", "must be 1 to 65535")
    for option, value in (("--max-body-bytes", args.max_body_bytes), ("--max-waits", args.max_waits)):
        if value < 1:
            raise UsageError(option, f"must be a positive integer, got {value}")
    tokens = _authorizer(args)
    codecs: list[Codec] = [JsonCodec(), CborCodec()]
    aes = _aes_gcm_key()
    if aes is not None:
        codecs.append(AesGcmCodec(aes[0], aes[1]))
    from admission.sql import masked_url

    service = open_async_service(args)
    read = read_db_url(args)
    stored: StoreArguments = "envelope" if args.store_envelope else "plaintext"
    parser = _http_parser()
    app = create_app(
        service,
        codecs=codecs_from(*codecs),
        store_arguments=stored,
        authorize=tokens,
        max_body_bytes=args.max_body_bytes,
        max_waits=args.max_waits,
    )
    # One JSON line saying where it listens, then uvicorn's log on stderr.
    print(
        json.dumps(
            {
                "serving": f"http://{args.host}:{args.port}",
                "database": masked_url(db_url(args)),
                "read_database": None if read is None else masked_url(read),
                "codecs": [c.name for c in codecs],
                "aes_gcm_key_id": None if aes is None else aes[1],
                "stored_arguments": stored,
                "auth": "none" if tokens is None else "bearer-tokens",
                "tokens": None if tokens is None else len(tokens.grants),
                "max_body_bytes": args.max_body_bytes,
                "max_waits": args.max_waits,
                "http_parser": parser,
            }
        ),
        flush=True,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        http=parser,
    )
    return EXIT_OK


def add_parser(commands: Commands) -> None:
    """Add ``serve``."""
    serve = commands.add_parser("serve", help="serve the HTTP API with uvicorn (needs the http extra)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    serve.add_argument(
        "--log-level", default="info", choices=("critical", "error", "warning", "info", "debug")
    )
    serve.add_argument("--access-log", action="store_true", help="log every request on stderr")
    serve.add_argument(
        "--store-envelope",
        action="store_true",
        help="store each command's input envelope as received (aes-gcm stays encrypted at rest) "
        "instead of the decoded arguments (docs/http.md)",
    )
    serve.add_argument(
        "--read-db",
        metavar="URL",
        help=f"a streaming replica of --db that answers retries whose receipt is final (default: "
        f"${ENV_READ_DB}; docs/replicas.md); when it fails, the primary answers",
    )
    serve.add_argument(
        "--tokens",
        metavar="FILE",
        help=f"require a bearer token granted the namespace (default: ${ENV_TOKENS}); "
        "as admission token create writes it",
    )
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve a non-loopback --host without tokens: anyone who reaches it acts in every namespace",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help=f"refuse a larger request body with 413 (default {DEFAULT_MAX_BODY_BYTES}: 2 MiB)",
    )
    serve.add_argument(
        "--max-waits",
        type=int,
        default=DEFAULT_MAX_WAITS,
        help=f"updates waited for at once; one more is refused with a retryable 503 ({DEFAULT_MAX_WAITS})",
    )
    serve.set_defaults(handler=_cmd_serve)
