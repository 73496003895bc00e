"""The command line's parser: ``--db`` is accepted before or after every command that takes a database."""

from __future__ import annotations

import argparse

import pytest

from admission.cli import build_parser
from admission.cli._parser import WITHOUT_DATABASE, leaf_commands

URL = "sqlite:////tmp/elsewhere.sqlite3"
OTHER = "postgresql://u@db.example/x"

# The least each command needs to parse; a new command fails
# test_the_table_names_every_command until it is added here.
MINIMAL: dict[tuple[str, ...], list[str]] = {
    ("db", "upgrade"): [],
    ("db", "check"): [],
    ("db", "downgrade"): ["0001"],
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
    [["intent", "--type", "signal", "--name", "n"], ["vectors", "verify"]],
    ids=["intent", "vectors verify"],
)
def test_commands_without_a_database_refuse_db_after_them(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse(["--db", URL, *words]).db == URL  # before: the global option, accepted and unused
    with pytest.raises(SystemExit) as exit_:
        parse([*words, "--db", URL])
    assert exit_.value.code == 2
    assert "--db" in capsys.readouterr().err
