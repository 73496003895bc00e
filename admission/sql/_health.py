"""Whether a connection the pool or a store kept is still usable, found without a round trip.

After a failover, a restart or ``pg_terminate_backend`` the server has closed
every session's socket; an idle connection that kept that socket fails the
first statement sent on it.  Polling the socket (no wait) finds it first, so
the connection is replaced before a call uses it
(``admission/sql/_connections.py`` for the kept ones, the engine's
``checkout`` event for pooled ones: :func:`checked_on_checkout`).  A
``pool_pre_ping`` would find it too, at the cost of a round trip on every
checkout.
"""

from __future__ import annotations

import select
from typing import Any, Final

from sqlalchemy import Dialect
from sqlalchemy.exc import DBAPIError, DisconnectionError

__all__ = ["checked_on_checkout", "connection_alive", "is_disconnect", "quiet", "watch"]


def connection_alive(dbapi_connection: Any) -> bool:
    """Whether an idle driver connection may still be used, found without a round trip.

    psycopg (PostgreSQL): its socket is polled with no wait.  An idle session
    is sent nothing unasked, so a socket that the server closed (a restart,
    a failover, ``pg_terminate_backend``, an idle timeout: the server sends a
    last error and closes) reads as hung up, and the connection is dead.  A
    socket that is only readable has its input taken in (a TLS session
    ticket, a notice) and the connection is dead if libpq then finds it
    broken.  Any other driver (SQLite: nothing to lose): alive.
    """
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    pgconn = getattr(driver, "pgconn", None)
    if pgconn is None:
        return True
    try:
        if driver.closed or driver.broken:
            return False
        poller = select.poll()
        poller.register(pgconn.socket, _POLLED)
        ready = poller.poll(0)
        if not ready:
            return True
        if ready[0][1] & _GONE:
            return False
        pgconn.consume_input()
        return bool(pgconn.status == 0)  # libpq's CONNECTION_OK
    except Exception:  # a socket or a libpq state that cannot even be asked: not usable
        return False


_GONE: Final = select.POLLHUP | select.POLLERR | select.POLLNVAL | getattr(select, "POLLRDHUP", 0)
_POLLED: Final = select.POLLIN | _GONE


def watch(dbapi_connection: Any) -> Any:
    """A poll object on the socket of a psycopg connection (``None`` for another driver), made once
    for a kept connection so that :func:`quiet` costs one system call."""
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    pgconn = getattr(driver, "pgconn", None)
    if pgconn is None:
        return None
    try:
        poller = select.poll()
        poller.register(pgconn.socket, _POLLED)
    except Exception:  # no socket to watch: the full check decides on every use
        return None
    return poller


def quiet(poller: Any, dbapi_connection: Any) -> bool:
    """:func:`connection_alive` for a kept connection watched by ``poller`` (from :func:`watch`):
    a socket with nothing to read is the common case, and needs nothing more."""
    if poller is not None and not poller.poll(0):
        return True
    return connection_alive(dbapi_connection)


def checked_on_checkout(dbapi_connection: Any, _record: object, _proxy: object) -> None:
    """The pool's checkout event: a connection the server ended is replaced before it is used
    (the pool opens another and checks again)."""
    if not connection_alive(dbapi_connection):
        raise DisconnectionError("the server closed this idle connection")


def is_disconnect(dialect: Dialect, error: BaseException, dbapi_connection: Any = None) -> bool:
    """Whether ``error`` (SQLAlchemy's or the driver's own) means the connection was lost."""
    if isinstance(error, DBAPIError):
        return bool(error.connection_invalidated)
    if not isinstance(error, dialect.loaded_dbapi.Error):
        return False
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    try:
        return bool(dialect.is_disconnect(error, driver, None))
    except Exception:  # a dialect that cannot tell: not a disconnect
        return False
