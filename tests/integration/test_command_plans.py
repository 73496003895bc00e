"""Commands are found by run through an index that leads with their instance (revision 0006).

Revision 0006 dropped the index by run, on the claim that every statement finding commands by
run also names their instance.  A run's whole life (admissions, continue-as-new with pending
commands handed down, close, retention) is played with every statement recorded, and each one
that reads or deletes ``workflow_commands`` by ``run_id`` is explained with its own parameters:
none may scan the table.  On PostgreSQL sequential scans are switched off for the explanation,
so a plan that still has one has no index to use; tiny tables are not what is tested.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event

from admission.receipts import AdmissionService
from admission.sql import SqlStore

BY_RUN = re.compile(r"workflow_commands\.run_id (IN|=)|FROM workflow_commands WHERE .*\brun_id (IN|=)", re.S)


def test_every_statement_finding_commands_by_run_uses_an_index_leading_with_the_instance(db_url: str) -> None:
    now = [datetime(2026, 1, 1, tzinfo=UTC)]

    def clock() -> datetime:
        now[0] += timedelta(seconds=1)
        return now[0]

    store = SqlStore.open(db_url)
    recorded: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        if BY_RUN.search(statement) and not statement.startswith("EXPLAIN"):
            recorded.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        service = AdmissionService(store, clock=clock)
        run = service.start_run("ns", "wf")
        service.admit_signal("ns", "wf", "go", [1], request_id="a")
        service.admit_update("ns", "wf", "set", [2], request_id="b", run_id=run.run_id)
        service.continue_as_new("ns", "wf")  # the pending commands are handed down
        service.admit_signal("ns", "wf", "go", [3], request_id="c")
        service.close_run("ns", "wf", "completed")
        now[0] += timedelta(days=40)
        assert service.prune(30, max_clock_lead=None).counts.runs == 2
        kinds = {statement.split()[0] for statement, _ in recorded}
        assert {"SELECT", "DELETE"} <= kinds, recorded  # the pending commands' read, retention's delete
        postgres = store.engine.dialect.name == "postgresql"
        with store.engine.connect() as conn:
            if postgres:
                conn.exec_driver_sql("SET enable_seqscan = off")
            for statement, parameters in recorded:
                explain = "EXPLAIN " if postgres else "EXPLAIN QUERY PLAN "
                plan = "\n".join(
                    str(row[-1]) for row in conn.exec_driver_sql(explain + statement, parameters)
                )
                scan = "Seq Scan on workflow_commands" if postgres else "SCAN workflow_commands"
                assert scan not in plan, f"{statement}\n{plan}"
            conn.rollback()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
        store.dispose()
