"""PostgreSQL behind a connection pooler in transaction mode (PgBouncer's ``pool_mode = transaction``).

Such a pooler lends a server connection to a client for one transaction
only: the client's next transaction may run on another server session.  So
nothing may be left in a session for later: no named prepared statement
(psycopg prepares a statement by name on the server after it ran five times
on one connection; the next transaction, on another server session, fails
with ``prepared statement "_pg3_0" does not exist``), no ``DEALLOCATE ALL``
(it would drop another client's statements on the session it lands on), no
session setting.  ``pooler="transaction"`` (or the URL's
``admission_pooler=transaction``) makes admission's engine keep to that:

* psycopg's ``prepare_threshold=None``: every statement is sent unnamed
  (parse, bind and execute in one exchange), so nothing is kept on a server
  session.  PgBouncer 1.21 and later can instead keep protocol-level prepared
  statements per server session (``max_prepared_statements``); admission does
  not rely on it, so the same engine runs on the 1.18 of Debian 12.
* no ``DEALLOCATE ALL`` and no replacing of read connections after some uses
  (``admission.sql._connections.REPLAN_AFTER``): both only exist to renew
  generic plans of prepared statements, and an unnamed statement is planned
  for its own parameters each time.
* ``schema=`` is refused: it is a startup parameter (``options``) that
  PgBouncer 1.18 refuses, and that a pooler lending each transaction any
  server session cannot be relied on to have applied there.

What admission already keeps inside transactions needs nothing more: the
admission lock is a row lock (``SELECT ... FOR UPDATE``), migrations set
``search_path`` with ``SET LOCAL``, the audit's isolation is given on its
``BEGIN``, the pipelined lock and lookup are one transaction's statements,
and nothing uses advisory locks, ``LISTEN``, temporary tables or ``SET``.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import Engine
from sqlalchemy.engine import URL

from admission.errors import InputError

__all__ = ["POOLERS", "POOLER_HINT", "POOLER_PARAMETER", "apply_pooler", "pooler_of"]

POOLERS: Final = ("transaction",)
"""The poolers admission knows: ``transaction`` (a pooler in transaction mode, PgBouncer's
``pool_mode = transaction``).  A pooler in session mode keeps a client's server session and
needs no setting."""

POOLER_PARAMETER: Final = "admission_pooler"
"""The URL query parameter that sets the pooler (``?admission_pooler=transaction``), popped by
admission before the driver sees the URL."""

POOLER_HINT: Final = (
    "behind a pooler in transaction mode (PgBouncer's pool_mode = transaction), "
    "add admission_pooler=transaction to the database URL"
)
"""What an error caused by a transaction pooler that admission was not told of says to do."""

_POOLER_OPTION: Final = "admission_pooler"
"""The engine execution option that records the pooler (see :func:`pooler_of`)."""

_DRIVERS: Final = ("psycopg", "psycopg_async")


def apply_pooler(url: URL, pooler: str | None, schema: str | None, kwargs: dict[str, Any]) -> URL:
    """``url`` without :data:`POOLER_PARAMETER`; the engine's ``kwargs`` set for the pooler it names
    (or ``pooler`` names), if any.

    Raises :class:`~admission.errors.InputError` (``field`` ``pooler``) for an unknown pooler, one
    given twice with two values, or one for a database other than PostgreSQL on psycopg; (``field``
    ``schema``) for a schema behind a pooler.
    """
    given = url.query.get(POOLER_PARAMETER)
    if given is not None:
        url = url.difference_update_query([POOLER_PARAMETER])
        if not isinstance(given, str):
            raise InputError(f"{POOLER_PARAMETER} is given more than once in the URL", field="pooler")
        if pooler is not None and pooler != given:
            raise InputError(f"the pooler is given twice: {pooler!r} and {POOLER_PARAMETER}", field="pooler")
        pooler = given
    if pooler is None:
        return url
    if pooler not in POOLERS:
        raise InputError(f"the pooler must be one of {', '.join(POOLERS)}, not {pooler!r}", field="pooler")
    if url.get_backend_name() != "postgresql" or url.get_driver_name() not in _DRIVERS:
        raise InputError("a pooler applies to PostgreSQL (postgresql:// URLs, psycopg) only", field="pooler")
    if schema is not None:
        raise InputError(
            "a schema is a connection's startup setting, which a transaction pooler does not keep; "
            "give the role or database a search_path on the server instead (docs/operations.md)",
            field="schema",
        )
    connect_args = dict(kwargs.pop("connect_args", {}))
    connect_args["prepare_threshold"] = None  # nothing prepared by name on a server session
    kwargs["connect_args"] = connect_args
    kwargs["execution_options"] = {**kwargs.get("execution_options", {}), _POOLER_OPTION: pooler}
    return url


def pooler_of(engine: Engine) -> str | None:
    """The pooler ``engine`` was made for (``"transaction"``), or ``None``: connected to the server."""
    pooler = engine.get_execution_options().get(_POOLER_OPTION)
    return pooler if isinstance(pooler, str) else None
