"""A real streaming-replication cluster for the tests: a primary and its standbys.

``ReplicatedCluster().start()`` starts a primary (``tests/support/pgserver.py``'s
:class:`PostgresServer`, same binaries, same non-root account when run as root, same
watchdog) with ``wal_level=replica``, ``full_page_writes=on`` and ``synchronous_commit=on``
(the suite's default is ``off``); ``initdb -A trust`` already lets loopback connect for
replication (checked, added to ``pg_hba.conf`` otherwise).

``add_standby(name, synchronous=True)`` clones the primary with ``pg_basebackup -R`` (so
the clone holds ``standby.signal`` and a ``primary_conninfo`` naming ``application_name=name``),
starts it on its own port, and, for a synchronous one, adds it to the primary's
``synchronous_standby_names``; it returns once ``pg_stat_replication`` shows it streaming
(and ``sync`` for a synchronous one).  ``kill_primary()`` SIGKILLs the primary's whole
process group (postmaster and backends: it runs in a session of its own), as a machine
loss would, with no shutdown checkpoint and every client socket closed.
``promote(name)`` turns a standby into the primary (``pg_promote()``, waiting until it
accepts writes).  ``pause_replay(name)`` / ``resume_replay(name)`` hold and release a
standby's replay (``pg_wal_replay_pause()``).  ``multihost_url(dbname)`` is the URL a
client gives admission to find whichever server accepts writes:
``postgresql+psycopg://postgres@/db?host=127.0.0.1:P1&host=127.0.0.1:P2&target_session_attrs=read-write``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.support.pgserver import PostgresError, PostgresServer

REPLICATION_SETTINGS: dict[str, str] = {
    "wal_level": "replica",
    "full_page_writes": "on",
    "synchronous_commit": "on",
    "max_wal_senders": "10",
    "hot_standby": "on",
    # A standby's status reports come at once, so that the primary sees it streaming soon.
    "wal_receiver_status_interval": "1s",
}

_HBA_REPLICATION = "host replication all 127.0.0.1/32 trust\n"


class StandbyServer(PostgresServer):
    """A server whose data directory is a ``pg_basebackup -R`` copy of ``source``, not an initdb."""

    def __init__(self, source: PostgresServer, name: str, **kwargs: Any) -> None:
        super().__init__(source.bindir, superuser=source.superuser, dbname=source.dbname, **kwargs)
        self.source = source
        self.name = name

    def _initdb(self, bindir: Path) -> None:
        basebackup = bindir / "pg_basebackup"
        if not basebackup.is_file():
            raise PostgresError(f"{basebackup} is missing: streaming replication needs pg_basebackup")
        conninfo = (
            f"host={self.source.host} port={self.source.port} user={self.source.superuser} "
            f"application_name={self.name}"
        )
        cmd = [str(basebackup), "-D", str(self.datadir), "-d", conninfo, "-R", "-X", "stream", "-c", "fast"]
        t = time.monotonic()
        self._run_as_server(cmd, "pg_basebackup")
        # The copy carries the primary's ALTER SYSTEM settings: once promoted, this server must not
        # wait for synchronous standbys of its own that do not exist.
        auto_conf = self.datadir / "postgresql.auto.conf"
        text = auto_conf.read_text()
        if f"application_name={self.name}" not in text:
            raise PostgresError(f"pg_basebackup -R wrote no application_name={self.name}:\n{text}")
        with auto_conf.open("a") as f:
            f.write("synchronous_standby_names = ''\n")
        self.initdb_seconds = time.monotonic() - t


class ReplicatedCluster:
    """A primary and named standbys on loopback; see the module docstring."""

    def __init__(self, *, settings: dict[str, str] | None = None, startup_timeout: float = 60.0) -> None:
        self.settings = {**REPLICATION_SETTINGS, **(settings or {})}
        self.startup_timeout = startup_timeout
        self.primary: PostgresServer | None = None
        self.standbys: dict[str, PostgresServer] = {}
        self.synchronous: list[str] = []
        self.killed: list[PostgresServer] = []

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> ReplicatedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ReplicatedCluster:
        primary = PostgresServer(settings=self.settings, startup_timeout=self.startup_timeout)
        self.primary = primary
        primary.start()
        hba = primary.datadir / "pg_hba.conf"
        if not any(line.split()[:2] == ["host", "replication"] for line in hba.read_text().splitlines()):
            with hba.open("a") as f:
                f.write(_HBA_REPLICATION)
            self._execute(primary, "SELECT pg_reload_conf()")
        return self

    def stop(self) -> None:
        """Stop every server (standbys first) and remove their directories.  Idempotent."""
        for server in [*self.standbys.values(), *self.killed, *([self.primary] if self.primary else [])]:
            server.stop()

    # -- servers -----------------------------------------------------------

    def _primary(self) -> PostgresServer:
        if self.primary is None:
            raise PostgresError("no primary: the cluster is not started or its primary was killed")
        return self.primary

    def server(self, name: str) -> PostgresServer:
        return self.standbys[name]

    @property
    def servers(self) -> list[PostgresServer]:
        """Every live server, the primary first: the host order of :meth:`multihost_url`."""
        return [*([self.primary] if self.primary else []), *self.standbys.values()]

    def add_standby(self, name: str, *, synchronous: bool = True) -> PostgresServer:
        """Clone the primary into a streaming standby called ``name``; returns it once streaming."""
        if name in self.standbys or not name.isidentifier():
            raise ValueError(f"standby name {name!r}: taken or not an identifier")
        primary = self._primary()
        standby = StandbyServer(primary, name, settings=self.settings, startup_timeout=self.startup_timeout)
        standby.start()
        self.standbys[name] = standby
        if synchronous:
            self.synchronous.append(name)
            names = ", ".join(f'"{n}"' for n in self.synchronous)
            self._execute(primary, f"ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 ({names})'")
            self._execute(primary, "SELECT pg_reload_conf()")
        self.wait_streaming(name)
        return standby

    def wait_streaming(self, name: str, *, timeout: float = 60.0) -> None:
        """Until the primary's ``pg_stat_replication`` shows ``name`` streaming (and sync, if it is)."""
        want_sync = name in self.synchronous
        deadline = time.monotonic() + timeout
        row = None
        while time.monotonic() < deadline:
            row = self._fetchone(
                self._primary(),
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                (name,),
            )
            if row is not None and row[0] == "streaming" and (not want_sync or row[1] == "sync"):
                return
            time.sleep(0.05)
        raise PostgresError(f"standby {name!r} is not streaming after {timeout:.0f}s (last: {row})")

    def wait_replayed(self, name: str, *, timeout: float = 60.0) -> None:
        """Until standby ``name`` has replayed everything the primary has written so far."""
        target = self._fetchone(self._primary(), "SELECT pg_current_wal_lsn()::text")
        assert target is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = self._fetchone(
                self.standbys[name], "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target[0],)
            )
            if row is not None and row[0]:
                return
            time.sleep(0.05)
        raise PostgresError(f"standby {name!r} did not replay up to {target[0]} within {timeout:.0f}s")

    def kill_primary(self) -> PostgresServer:
        """SIGKILL the primary's postmaster and every backend at once; returns the dead server."""
        primary = self._primary()
        proc = primary._proc
        if proc is None:
            raise PostgresError("primary not started")
        # The postmaster leads its own session and process group; its backends are in it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        self.primary = None
        self.killed.append(primary)
        return primary

    def promote(self, name: str, *, timeout: int = 60) -> PostgresServer:
        """Promote standby ``name`` (``pg_promote()``, waiting); it becomes the cluster's primary."""
        standby = self.standbys[name]
        row = self._fetchone(standby, f"SELECT pg_promote(true, {int(timeout)})")
        if row is None or row[0] is not True:
            raise PostgresError(f"standby {name!r} was not promoted within {timeout}s")
        if self._fetchone(standby, "SELECT pg_is_in_recovery()") != (False,):
            raise PostgresError(f"standby {name!r} is still in recovery after pg_promote()")
        if self.primary is not None:
            self.killed.append(self.primary)
        del self.standbys[name]
        self.synchronous = [n for n in self.synchronous if n != name]
        self.primary = standby
        return standby

    def pause_replay(self, name: str, *, timeout: float = 30.0) -> None:
        """Hold standby ``name``'s replay; returns once it has paused."""
        standby = self.standbys[name]
        self._execute(standby, "SELECT pg_wal_replay_pause()")
        deadline = time.monotonic() + timeout
        while self._fetchone(standby, "SELECT pg_get_wal_replay_pause_state()") != ("paused",):
            if time.monotonic() > deadline:
                raise PostgresError(f"standby {name!r} did not pause replay within {timeout:.0f}s")
            time.sleep(0.02)

    def resume_replay(self, name: str) -> None:
        self._execute(self.standbys[name], "SELECT pg_wal_replay_resume()")

    # -- URLs --------------------------------------------------------------

    def multihost_url(self, dbname: str | None = None, *, servers: list[PostgresServer] | None = None) -> str:
        """SQLAlchemy's multi-host form over ``servers`` (default: every live one), read-write target."""
        servers = self.servers if servers is None else servers
        if not servers:
            raise PostgresError("no server to name in the URL")
        first = servers[0]
        user, db = quote(first.superuser, safe=""), quote(dbname or first.dbname, safe="")
        hosts = "&".join(f"host={s.host}:{s.port}" for s in servers)
        return f"postgresql+psycopg://{user}@/{db}?{hosts}&target_session_attrs=read-write"

    def create_database(self, name: str, *, template: str = "template0") -> str:
        """``CREATE DATABASE`` on the primary (standbys get it by replication); its multi-host URL."""
        self._primary().create_database(name, template=template)
        return self.multihost_url(name)

    # -- SQL ---------------------------------------------------------------

    @staticmethod
    def _connect(server: PostgresServer) -> Any:
        import psycopg

        return psycopg.connect(**server.conninfo(), autocommit=True, connect_timeout=10)

    def _execute(self, server: PostgresServer, sql: str, params: tuple[Any, ...] = ()) -> None:
        with self._connect(server) as conn:
            conn.execute(sql, params)

    def _fetchone(self, server: PostgresServer, sql: str, params: tuple[Any, ...] = ()) -> Any:
        with self._connect(server) as conn:
            row = conn.execute(sql, params).fetchone()
        return None if row is None else tuple(row)
