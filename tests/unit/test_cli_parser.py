"""The command line's parser and ``main``: ``--db`` before or after every command that takes a database;
every failure one line on stderr and a documented exit code."""

from __future__ import annotations

import argparse

import pytest

from admission.cli import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_INVALID, EXIT_PIPE, build_parser, main
from admission.cli._parser import WITHOUT_DATABASE, leaf_commands

URL = "sqlite:////tmp/elsewhere.sqlite3"
OTHER = "postgresql://u@db.example/x"

# The least each command needs to parse; a new command fails
# test_the_table_names_every_command until it is added here.
MINIMAL: dict[tuple[str, ...], list[str]] = {
    ("db", "upgrade"): [],
    ("db", "check"): [],
    ("db", "downgrade"): ["0001"],
    ("db", "rebase-events"): ["--cursor", "12:3"],
    ("start",): ["wf"],
    ("close",): ["wf", "--status", "completed"],
    ("signal",): ["wf", "go"],
    ("update",): ["wf", "approve"],
    ("complete-update",): ["wf", "u-1"],
    ("receipt",): ["wf", "--type", "signal", "--request-id", "k"],
    ("history",): ["wf"],
    ("prune",): [],
    ("serve",): [],
    ("demo",): [],
    ("worker", "accept"): ["--scope", "s.json"],
    ("worker", "once"): ["--scope", "s.json"],
    ("worker", "start"): ["--scope", "s.json"],
    ("worker", "status"): ["--scope", "s.json"],
    ("worker", "observe"): ["--scope", "s.json"],
    ("worker", "poll-status"): ["--scope", "s.json"],
    ("worker", "resolve"): [
        "--scope", "s.json", "--write-id", "w", "--decision", "confirm", "--actor", "a", "--reason", "r"
    ],
    ("jobs", "status"): [],
    ("jobs", "pause"): ["j"],
    ("jobs", "resume"): ["j"],
    ("jobs", "stop"): ["j"],
    ("jobs", "cancel"): ["j"],
    ("jobs", "resolve"): ["j", "--outcome", "completed", "--who", "w", "--why", "y"],
}  # fmt: skip


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_the_table_names_every_command() -> None:
    commands = {path for path, _ in leaf_commands(build_parser())}
    assert commands - WITHOUT_DATABASE == set(MINIMAL)
    assert commands >= WITHOUT_DATABASE


@pytest.mark.parametrize("command", sorted(MINIMAL), ids=" ".join)
def test_db_after_the_command_is_the_db_before_it(command: tuple[str, ...]) -> None:
    words = [*command, *MINIMAL[command]]
    before = parse(["--db", URL, *words])
    after = parse([*words, "--db", URL])
    assert before.db == URL
    assert vars(after) == vars(before)
    assert parse([*words, f"--db={URL}"]).db == URL
    # Written twice, the one after the command wins, as the later of two options does.
    assert parse(["--db", OTHER, *words, "--db", URL]).db == URL
    assert parse(words).db is None  # neither: $ADMISSION_DB, then the default, as before


@pytest.mark.parametrize(
    "words",
    [
        ["intent", "--type", "signal", "--name", "n"],
        ["vectors", "verify"],
        ["token", "create", "--name", "n", "--namespace", "a"],
        ["token", "list"],
        ["token", "revoke", "--name", "n"],
    ],
    ids=["intent", "vectors verify", "token create", "token list", "token revoke"],
)
def test_commands_without_a_database_refuse_db_after_them(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse(["--db", URL, *words]).db == URL  # before: the global option, accepted and unused
    with pytest.raises(SystemExit) as exit_:
        parse([*words, "--db", URL])
    assert exit_.value.code == 2
    assert "--db" in capsys.readouterr().err


# -- main: every failure one line and a documented code -----------------------------------------------------


def run_main_with(
    handler: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    from admission.cli import _intent

    monkeypatch.setattr(_intent, "_cmd_intent", handler)
    code = main(["intent", "--type", "signal", "--name", "n"])
    return code, capsys.readouterr().err


def test_an_interrupt_exits_130_on_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(_args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    assert run_main_with(interrupted, monkeypatch, capsys) == (EXIT_INTERRUPTED, "admission: interrupted\n")


def test_an_error_admission_did_not_foresee_is_named_on_one_line_without_what_follows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(_args: argparse.Namespace) -> int:
        # As SQLAlchemy writes its errors: the statement and its parameters on the lines below.
        raise LookupError("no such thing\n[SQL: SELECT 1]\n[parameters: ('secret-key',)]")

    code, err = run_main_with(broken, monkeypatch, capsys)
    assert code == EXIT_INTERNAL
    assert err == "admission: unexpected LookupError: no such thing (a bug in admission; please report it)\n"


def test_a_closed_stdout_exits_141_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def reader_gone(_args: argparse.Namespace) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    assert run_main_with(reader_gone, monkeypatch, capsys) == (EXIT_PIPE, "")


def test_a_refused_command_line_is_one_line_with_the_password_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["history", "wf", "postgresql://u:pw-123@h/x?password=pw-456"])
    assert exit_.value.code == EXIT_INVALID
    err = capsys.readouterr().err
    assert err == (
        "admission: unrecognized arguments: postgresql://u:***@h/x?password=***; see `admission --help`\n"
    )


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["start", "wf\udcff"], "argument 2"),
        (["start", "wf", "--run-id", "r\udcff"], "--run-id"),
        (["start", "wf", "--run-id=r\udcff"], "--run-id"),
    ],
)
def test_an_argument_that_is_not_utf8_is_refused_naming_it(
    argv: list[str], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == EXIT_INVALID
    assert capsys.readouterr().err == f"admission: {field}: is not valid UTF-8\n"
