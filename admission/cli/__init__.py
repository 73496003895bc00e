"""The ``admission`` command line: the composition root.

This is the only code that reads the environment or parses command-line
input: the parser, and one module per command group.  Every command prints
JSON on stdout.  Bad input prints one clear line naming the field on stderr,
exits 2 and writes nothing.

Exit codes: 0 fresh or retained; 1 a check found a mismatch; 2 invalid
input; 3 the database is not at the schema revision this version reads;
4 refused by run state (``run_not_active``, ``rejected_not_current``, a
lifecycle call that does not fit; for ``worker``: a full queue, a record
outside the scope, a record in the wrong state; for ``jobs``: an event that
does not fit the job's state); 9 ``request_id_conflict`` (``worker accept``:
changed content under an accepted key); 10 ``request_id_ambiguous``; 11
another worker owns the queue (file lock or lease) or this one was fenced; 12
``conformance``: the target could not be reached or answered outside the
contract; 5
a storage failure; 6 the database holds admission's tables but records no
revision (``db upgrade --adopt`` adopts them); 7 ``db upgrade --adopt``
refused: the tables differ from revision ``0001``; 70 an error admission did
not foresee (a bug, named on one line); 73 the injected
``crash-after-write`` fault (docs/worker.md); 130 interrupted; 141 standard
output closed early (nothing on stderr).  No failure prints a traceback
(docs/cli.md).
"""

from admission.cli._common import (
    EXIT_AMBIGUOUS,
    EXIT_CONFLICT,
    EXIT_DRIFTED,
    EXIT_FAILED,
    EXIT_FINDINGS,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_OK,
    EXIT_OWNED,
    EXIT_PIPE,
    EXIT_REFUSED,
    EXIT_SCHEMA,
    EXIT_STORAGE,
    EXIT_TARGET,
    EXIT_UNSTAMPED,
)
from admission.cli._parser import build_parser, main

__all__ = [
    "EXIT_AMBIGUOUS",
    "EXIT_CONFLICT",
    "EXIT_DRIFTED",
    "EXIT_FAILED",
    "EXIT_FINDINGS",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID",
    "EXIT_OK",
    "EXIT_OWNED",
    "EXIT_PIPE",
    "EXIT_REFUSED",
    "EXIT_SCHEMA",
    "EXIT_STORAGE",
    "EXIT_TARGET",
    "EXIT_UNSTAMPED",
    "build_parser",
    "main",
]
