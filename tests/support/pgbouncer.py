"""A throwaway, real PgBouncer in transaction pooling mode, in front of the test PostgreSQL server.

``PgBouncer(server).start()`` writes a configuration into a fresh temporary
directory and runs ``pgbouncer`` on 127.0.0.1 at a free port with
``pool_mode = transaction`` and ``auth_type = trust``, every database of
``server`` reachable through it (``[databases] * = host=... port=...``).
``url_for(name)`` is the SQLAlchemy URL of a database through it;
``admin()`` opens its admin console (``SHOW POOLS``, ``SHOW STATS``...).
``stop()`` ends it and removes the directory.  Nothing is mocked.

Where ``pgbouncer`` comes from: ``$ADMISSION_PGBOUNCER`` (a path), else
``PATH``, ``/usr/sbin``, ``/usr/bin``.  Missing, as root with ``apt-get``:
Debian's package is installed (``apt-get update`` then ``apt-get install -y
--no-install-recommends pgbouncer``) under a file lock, as
``tests/support/pgserver.py`` installs PostgreSQL.  The package's own service,
if its scripts start one, listens on its own port (6432) and is never used:
the tests run their own process.  Missing otherwise: :class:`PgBouncerError`
(the fixtures fail under CI, skip elsewhere).

PgBouncer refuses to run as root: when the tests run as root it runs as the
PostgreSQL server's account (``pgserver.server_account``), its configuration
and log in a directory that account owns.  Cleanup as ``pgserver`` does it:
``stop()`` is registered with ``atexit``, and a watchdog process ends
PgBouncer and removes the directory when the test process dies without it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.support.pgserver import (
    PostgresServer,
    Watchdog,
    _file_lock,
    _port_open,
    _run_logged,
    _temp_base,
    free_port,
    server_account,
)

ENV_BINARY = "ADMISSION_PGBOUNCER"
SEARCHED = ("/usr/sbin", "/usr/bin")

POOL_SIZE = 20
"""Server connections per database and user: above what one test holds in transactions at once
(the races run 8 processes)."""

SETTINGS: dict[str, str] = {
    "pool_mode": "transaction",
    "auth_type": "trust",
    "default_pool_size": str(POOL_SIZE),
    "max_client_conn": "1000",
    # Every test has a database of its own, so a pool each: idle server connections of tests
    # that ended are closed soon, and the server's connections (max_connections = 200) are
    # shared out under one cap, PgBouncer evicting another pool's idle one when it is reached.
    "server_idle_timeout": "5",
    "max_user_connections": "150",
    "server_login_retry": "1",
    "unix_socket_dir": "",
}

PREPARED_SINCE = (1, 21)
"""The first PgBouncer that can keep protocol-level prepared statements (``max_prepared_statements``;
on by default since 1.22).  Set to 0 here, so that every version behaves as Debian 12's 1.18: what
admission must do without that help is what the tests check."""

_LOG_TAIL = 6000


class PgBouncerError(RuntimeError):
    """PgBouncer could not be found, installed or started."""


def find_binary(env: Mapping[str, str] | None = None) -> Path | None:
    """``$ADMISSION_PGBOUNCER``, else ``pgbouncer`` on ``PATH``, in ``/usr/sbin`` or ``/usr/bin``."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_BINARY)
    if explicit:
        return Path(explicit) if os.access(explicit, os.X_OK) else None
    found = shutil.which("pgbouncer", path=env.get("PATH", os.defpath))
    if found is None:
        found = next((f"{d}/pgbouncer" for d in SEARCHED if os.access(f"{d}/pgbouncer", os.X_OK)), None)
    return None if found is None else Path(found)


def version_of(binary: Path) -> tuple[int, ...]:
    """``pgbouncer --version``'s first line as numbers: ``PgBouncer 1.18.0`` -> ``(1, 18, 0)``."""
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", out)
    if match is None:
        raise PgBouncerError(f"{binary} --version said {out[:200]!r}")
    return tuple(int(part) for part in match.groups(default="0"))


def ensure_binary() -> Path:
    """The ``pgbouncer`` binary, installed with apt-get (as root) when it is missing."""
    found = find_binary()
    if found is not None:
        return found
    apt_get = shutil.which("apt-get")
    if os.geteuid() != 0 or apt_get is None or os.environ.get(ENV_BINARY):
        raise PgBouncerError(f"pgbouncer is not installed (apt-get install pgbouncer, or set {ENV_BINARY})")
    env = {"PATH": os.environ.get("PATH") or os.defpath, "DEBIAN_FRONTEND": "noninteractive"}
    with _file_lock("admission-pgbouncer-install"):
        found = find_binary()  # another test process may have installed it meanwhile
        if found is not None:
            return found
        try:
            # Another installer (PostgreSQL's, tests/support/pgserver.py) may hold dpkg's lock: wait for it.
            wait = ["-o", "DPkg::Lock::Timeout=600"]
            _run_logged([apt_get, *wait, "update", "-q"], env=env, timeout=900)
            _run_logged(
                [apt_get, *wait, "install", "-y", "-q", "--no-install-recommends", "pgbouncer"],
                env=env,
                timeout=900,
            )
        except Exception as exc:
            raise PgBouncerError(f"pgbouncer could not be installed: {exc}") from exc
    found = find_binary()
    if found is None:
        raise PgBouncerError("apt-get installed pgbouncer but no pgbouncer binary was found")
    return found


class PgBouncer:
    """A private PgBouncer in transaction pooling mode in front of ``server``."""

    host = "127.0.0.1"

    def __init__(self, server: PostgresServer, *, startup_timeout: float = 30.0) -> None:
        self.server = server
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.root: Path | None = None
        self.binary: Path | None = None
        self.version: tuple[int, ...] = ()
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: Watchdog | None = None
        self._stopped = False

    @property
    def log_path(self) -> Path:
        assert self.root is not None, "not started"
        return self.root / "pgbouncer.log"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise PgBouncerError("pgbouncer not started")
        return self._proc.pid

    def url_for(self, dbname: str) -> str:
        """The SQLAlchemy URL (psycopg 3) of ``dbname`` on the server, through PgBouncer."""
        if self.port is None:
            raise PgBouncerError("pgbouncer not started")
        user, db = quote(self.server.superuser, safe=""), quote(dbname, safe="")
        return f"postgresql+psycopg://{user}@{self.host}:{self.port}/{db}"

    def admin(self) -> Any:
        """An autocommit psycopg connection to the admin console (database ``pgbouncer``).

        The console speaks the simple query protocol only: ``ClientCursor`` sends it.
        """
        import psycopg

        return psycopg.connect(
            host=self.host,
            port=self.port,
            user=self.server.superuser,
            dbname="pgbouncer",
            autocommit=True,
            cursor_factory=psycopg.ClientCursor,
        )

    def show(self, what: str) -> list[dict[str, Any]]:
        """The rows of the admin console's ``SHOW <what>``, as dicts."""
        with self.admin() as conn:
            cursor = conn.execute(f"SHOW {what}")
            names = [column.name for column in cursor.description or ()]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def start(self) -> PgBouncer:
        if self._proc is not None or self._stopped:
            raise PgBouncerError("a PgBouncer can be started once")
        if self.server.port is None:
            raise PgBouncerError("the PostgreSQL server is not started")
        self.binary = ensure_binary()
        self.version = version_of(self.binary)
        account = server_account()
        self.root = Path(tempfile.mkdtemp(prefix="admission-pgb-", dir=_temp_base(account is not None)))
        atexit.register(self.stop)
        try:
            self._watchdog = Watchdog(self.root, signal.SIGTERM)
            self.root.chmod(0o700)
            if account is not None:
                os.chown(self.root, account.pw_uid, account.pw_gid)
            self._launch(account)
        except BaseException:
            self.stop()
            raise
        return self

    def _write(self, name: str, text: str, account: Any) -> Path:
        path = self._root() / name
        path.write_text(text)
        if account is not None:
            os.chown(path, account.pw_uid, account.pw_gid)
        return path

    def _root(self) -> Path:
        assert self.root is not None
        return self.root

    def _config(self, port: int) -> str:
        superuser = self.server.superuser
        auth_file = self._root() / "userlist.txt"
        settings = {
            "listen_addr": self.host,
            "listen_port": str(port),
            "auth_file": str(auth_file),
            "admin_users": superuser,
            "stats_users": superuser,
            **SETTINGS,
        }
        if self.version >= PREPARED_SINCE:
            settings["max_prepared_statements"] = "0"
        lines = ["[databases]", f"* = host={self.server.host} port={self.server.port}", "", "[pgbouncer]"]
        lines += [f"{key} = {value}" for key, value in settings.items()]
        return "\n".join(lines) + "\n"

    def _launch(self, account: Any) -> None:
        # auth_type = trust still needs each user in the auth file; the password is not checked.
        self._write("userlist.txt", f'"{self.server.superuser}" ""\n', account)
        env = {"PATH": os.environ.get("PATH") or os.defpath, "HOME": str(self._root()), "LC_ALL": "C"}
        as_account: dict[str, Any] = {}
        if account is not None:
            as_account = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        for _attempt in range(5):
            self.port = free_port(self.host)
            config = self._write("pgbouncer.ini", self._config(self.port), account)
            log = self.log_path.open("ab")
            if account is not None:
                os.chown(self.log_path, account.pw_uid, account.pw_gid)
            with log:
                self._proc = subprocess.Popen(
                    [str(self.binary), str(config)], stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, cwd=self.root, env=env, start_new_session=True, **as_account,
                )  # fmt: skip
            self._tell_watchdog(str(self._proc.pid))
            if self._wait_ready():
                return
            if "Address already in use" not in self._tail():
                raise PgBouncerError(f"pgbouncer exited with {self._proc.returncode}:\n{self._tail()}")
        raise PgBouncerError(f"pgbouncer could not bind a port:\n{self._tail()}")

    def _wait_ready(self) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            if _port_open(self.host, self.port or 0):
                return True
            time.sleep(0.02)
        raise PgBouncerError(f"pgbouncer did not listen within {self.startup_timeout:.0f}s:\n{self._tail()}")

    def _tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-_LOG_TAIL:]
        except OSError as exc:
            return f"(no log: {exc})"

    def _tell_watchdog(self, line: str) -> None:
        if self._watchdog is not None:
            self._watchdog.tell(line)

    def stop(self) -> None:
        """End PgBouncer (SIGTERM, then SIGKILL) and remove the directory.  Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
                try:
                    proc.wait(timeout=5)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._watchdog is not None:
            self._watchdog.finish()
        atexit.unregister(self.stop)


if __name__ == "__main__":  # pragma: no cover - manual check: python -m tests.support.pgbouncer
    with PostgresServer() as srv:
        bouncer = PgBouncer(srv).start()
        try:
            print(bouncer.url_for("postgres"), bouncer.binary, bouncer.show("CONFIG")[:1])
        finally:
            bouncer.stop()
