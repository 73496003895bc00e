"""The machine's engine rules: the engine's progress and the runs' lifecycle (contract §5).

Progress: a pending signal is applied, an accepted update completed or failed
(again with the same value: a retry, never a second effect); anything else is
refused.  Lifecycle: runs start, close and continue as new, handing their
instance-scope pending commands on; retention prunes closed chains.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Final

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from admission.conformance._admit_rules import ANYONE, AdmissionRules
from admission.conformance._model import (
    Command,
    Instance,
    Run,
    begin,
    close,
    continue_as_new,
    expected_receipt,
    expected_run,
    prune,
    prune_plan,
    prune_times,
    wire_differences,
)
from admission.conformance._target import LIFECYCLE, PROGRESS, PRUNE, Answer
from admission.intent._encoding import canonical_decode, canonical_encode

__all__ = ["EngineRules"]

# Now and then the engine names a command in the other namespace's twin instance.
ELSEWHERE: Final = st.integers(min_value=0, max_value=9).map(lambda n: n == 0)
# Time the machine lets pass before a lifecycle call: often none, sometimes hours or days.
LATER: Final = st.sampled_from((0, 0, 0, 1, 24, 49))
RESULTS: Final[tuple[object, ...]] = (None, 0, "ok", [1, 2], {"n": 1.5})
FAILURES: Final = ("boom", "invalid input")
CLOSE_STATUSES: Final = ("completed", "failed", "cancelled", "terminated")
COUNTS: Final = ("runs", "commands", "updates", "events")


class EngineRules(AdmissionRules):
    """The engine's progress, the runs' lifecycle and retention, on top of admission."""

    # -- the engine's progress -----------------------------------------------------------------------

    def pick(
        self, data: st.DataObject, command_type: str, anyone: bool, elsewhere: bool
    ) -> tuple[Instance, Command | None, str]:
        """A pending command of the type, or (now and then) any: finished, refused, pruned; the
        instance asked (``elsewhere``: the same workflow id in the other namespace); the id named."""
        candidates = [
            (where, c.id)
            for where, inst in self.instances.items()
            for c in [*inst.commands.values(), *inst.pruned]
            if c.type == command_type
        ]
        pending = [
            (w, c) for w, c in candidates if c in self.instances[w].commands and self.command(w, c).pending
        ]
        if pending and not anyone:
            candidates = pending
        if not candidates:
            return next(iter(self.instances.values())), None, "no-such-id"
        where, command_id = data.draw(st.sampled_from(candidates), label=command_type)
        inst = self.instances[where]
        cmd = self.command(where, command_id)
        named = (cmd.update_id or cmd.id) if command_type == "update" else cmd.id
        twin = self.other(inst) if elsewhere else None
        asked = twin or inst
        self.touch(inst, asked)
        if twin is not None or any(c is cmd for c in inst.pruned):
            return asked, None, named
        return asked, cmd, named

    def has(self, command_type: str) -> bool:
        """Whether the example has met a command of the type."""
        return any(
            c.type == command_type for i in self.instances.values() for c in [*i.commands.values(), *i.pruned]
        )

    @precondition(lambda self: self.allows(PROGRESS) and self.has("signal"))
    @rule(data=st.data(), anyone=ANYONE, elsewhere=ELSEWHERE)
    def apply(self, data: st.DataObject, anyone: bool, elsewhere: bool) -> None:
        """The engine delivers a signal (docs/lifecycle.md: pending in the open run, else refused)."""
        self.step("apply")
        inst, cmd, command_id = self.pick(data, "signal", anyone, elsewhere)
        self.traced(f"apply {inst.label} command={command_id}")

        def call() -> Answer:
            answer = self.target.apply_signal(inst.namespace, inst.workflow_id, command_id)
            self.stats.trace[-1] += f" -> {answer.body.get('outcome')} {answer.body.get('signal_status')}"
            return answer

        if cmd is None or cmd.refused:
            # Unknown here: never admitted in this instance, refused, or pruned.
            self.refused("command_unknown", call, "apply unknown")
        elif cmd.status == "applied":
            self.seen("apply again")
            self.compare(
                "the applied signal",
                self.invoke(call),
                expected_receipt(inst, cmd, retained=True),
                status=False,
            )
        elif cmd.status == "rejected":
            self.refused("run_state", call, "apply rejected")
        else:
            answer = self.invoke(call)
            cmd.status, cmd.owner = "applied", None
            self.compare(
                "the applied signal", answer, expected_receipt(inst, cmd, retained=False), status=False
            )
            inst.events.append(("SignalApplied", inst.current, cmd.id, None))
            self.seen("apply fresh")

    def finish(self, data: st.DataObject, anyone: bool, elsewhere: bool, status: str, value: object) -> None:
        """Complete (with a result) or fail (with a message) an update."""
        inst, cmd, update_id = self.pick(data, "update", anyone, elsewhere)
        if cmd is not None and cmd.status == status and data.draw(st.booleans(), label="repeat"):
            # A finished update is finished again with its own value half of the time:
            # the retry of a completion (contract §5) must not hinge on a lucky draw.
            value = canonical_decode(cmd.result) if status == "completed" and cmd.result else cmd.failure
        verb = "complete" if status == "completed" else "fail"
        self.traced(f"{verb} {inst.label} update={update_id} value={value!r:.40}")

        def call() -> Answer:
            if status == "completed":
                answer = self.target.complete_update(inst.namespace, inst.workflow_id, update_id, value)
            else:
                answer = self.target.fail_update(inst.namespace, inst.workflow_id, update_id, str(value))
            self.stats.trace[-1] += f" -> {answer.body.get('outcome')}"
            return answer

        if cmd is None or cmd.refused:
            self.refused("update_unknown", call, f"{status} unknown")
            return
        encoded = canonical_encode(value)
        if cmd.status == "accepted":
            answer = self.invoke(call)
            cmd.status, cmd.owner = status, None
            if status == "completed":
                cmd.result = encoded
            else:
                cmd.failure = str(value)
            self.compare(
                f"the {status} update", answer, expected_receipt(inst, cmd, retained=False), status=False
            )
            # The event goes to the run the update finished in: the open run, the successor
            # of the one it was admitted in after a handoff.
            detail = cmd.failure if status == "failed" else None
            inst.events.append(
                ("UpdateCompleted" if status == "completed" else "UpdateFailed", inst.current, cmd.id, detail)
            )
            self.seen(f"{status} fresh")
            return
        same = cmd.result == encoded if status == "completed" else cmd.failure == value
        if cmd.status == status and same:
            # The same completion twice is a retry, never a second effect (§5).
            self.compare(
                f"the {status} update",
                self.invoke(call),
                expected_receipt(inst, cmd, retained=True),
                status=False,
            )
            self.seen(f"{status} again")
            return
        self.refused("run_state", call, f"{status} refused")

    @precondition(lambda self: self.allows(PROGRESS) and self.has("update"))
    @rule(data=st.data(), anyone=ANYONE, elsewhere=ELSEWHERE)
    def complete(self, data: st.DataObject, anyone: bool, elsewhere: bool) -> None:
        """The engine completes an update with a result."""
        self.step("complete")
        result = data.draw(st.sampled_from((*RESULTS, *self.arguments)), label="result")
        self.finish(data, anyone, elsewhere, "completed", result)

    @precondition(lambda self: self.allows(PROGRESS) and self.has("update"))
    @rule(data=st.data(), anyone=ANYONE, elsewhere=ELSEWHERE, failure=st.sampled_from(FAILURES))
    def fail(self, data: st.DataObject, anyone: bool, elsewhere: bool, failure: str) -> None:
        """The engine fails an update with a message."""
        self.step("fail")
        self.finish(data, anyone, elsewhere, "failed", failure)

    # -- runs ------------------------------------------------------------------------------------------

    def check_run(self, what: str, body: Mapping[str, object], inst: Instance, run: Run, full: bool) -> None:
        """A ``RunInfo`` body against the model's run."""
        self.differ(what, wire_differences(body, expected_run(inst, run, full)))

    def new_run_id(self, inst: Instance, body: Mapping[str, object]) -> str:
        """The id a started run carries: new to the instance."""
        run_id = body.get("run_id")
        self.differ(
            "the started run",
            {"run_id": (run_id, "a new run id")},
            not isinstance(run_id, str) or run_id in inst.all_run_ids,
        )
        assert isinstance(run_id, str)
        return run_id

    def start_run(self, inst: Instance) -> None:
        """Start a run (refused while one is open)."""
        self.touch(inst)
        current = inst.current_run()
        self.traced(f"start {inst.label}")
        if current is not None and current.status == "open":
            self.refused(
                "run_state", lambda: self.target.start_run(inst.namespace, inst.workflow_id), "start refused"
            )
            return
        body = self.invoke(lambda: self.target.start_run(inst.namespace, inst.workflow_id))
        self.stats.trace[-1] += f" -> run {body.get('run_id')}"
        run_id = self.new_run_id(inst, body)
        if current is not None:
            number = current.number + 1
        elif not inst.all_run_ids:
            number = 1
        else:
            # Every run was pruned: the contract does not say how numbering goes on.
            got = body.get("run_number")
            number = got if isinstance(got, int) and got >= 1 else 1
        run = Run(run_id, number, "open", None, started_at=self.time_of(body, "started_at"))
        self.check_run("the started run", body, inst, run, full=True)
        begin(inst, run)

    @precondition(lambda self: self.allows(LIFECYCLE))
    @rule(data=st.data(), anyone=ANYONE, hours=LATER)
    def start(self, data: st.DataObject, anyone: bool, hours: int) -> None:
        """Start a run, mostly where none is open."""
        self.step("start", hours)
        opened = self.open_instances()
        closed = [i for i in self.instances.values() if not any(i is o for o in opened)]
        self.start_run(self.choose(data, anyone, closed))

    @precondition(lambda self: self.allows(LIFECYCLE))
    @rule(data=st.data(), anyone=ANYONE, status=st.sampled_from(CLOSE_STATUSES), hours=LATER)
    def close(self, data: st.DataObject, anyone: bool, status: str, hours: int) -> None:
        """Close the current run: its pending signals are rejected and its updates fail."""
        self.step("close", hours)
        inst = self.choose(data, anyone, self.open_instances())
        self.touch(inst)
        run = inst.open_run()
        self.traced(f"close {inst.label} status={status}")
        if run is None:
            self.refused(
                "run_state",
                lambda: self.target.close_run(inst.namespace, inst.workflow_id, status),
                "close refused",
            )
            return
        body = self.invoke(lambda: self.target.close_run(inst.namespace, inst.workflow_id, status))
        self.stats.trace[-1] += f" -> run {body.get('run_id')} {body.get('status')}"
        close(inst, run, status, self.time_of(body, "closed_at"))
        self.check_run("the closed run", body, inst, run, full=False)

    @precondition(lambda self: self.allows(LIFECYCLE))
    @rule(data=st.data(), anyone=ANYONE, hours=LATER)
    def continue_as_new(self, data: st.DataObject, anyone: bool, hours: int) -> None:
        """Continue the current run as new: its instance-scope pending commands are handed on."""
        self.step("continue_as_new", hours)
        # Preferably a run with something to hand on.
        busy = [
            i
            for i in self.open_instances()
            if any(c.pending and c.target is None for c in i.commands.values())
        ]
        inst = self.choose(data, anyone, busy or self.open_instances())
        self.touch(inst)
        run = inst.open_run()
        self.traced(f"continue-as-new {inst.label}")
        if run is None:
            self.refused(
                "run_state",
                lambda: self.target.continue_as_new(inst.namespace, inst.workflow_id),
                "continue refused",
            )
            return
        body = self.invoke(lambda: self.target.continue_as_new(inst.namespace, inst.workflow_id))
        self.stats.trace[-1] += f" -> run {body.get('run_id')}"
        started = self.time_of(body, "started_at")
        successor = Run(self.new_run_id(inst, body), run.number + 1, "open", run.id, started_at=started)
        # The closing time is the successor's start: one step, one clock reading.
        for _ in continue_as_new(inst, run, successor, started):
            self.seen("handed off")
        self.check_run("the successor run", body, inst, successor, full=True)

    # -- retention ----------------------------------------------------------------------------------

    @precondition(lambda self: self.allows(PRUNE))
    @rule(data=st.data(), retention=st.sampled_from((0, 1, 2)), dry_run=st.booleans())
    def prune(self, data: st.DataObject, retention: int, dry_run: bool) -> None:
        """Prune by retention at an interesting ``now``: the counts, and afterwards the logs and
        the freed keys, are the model's."""
        self.step("prune")
        now = data.draw(
            st.sampled_from(prune_times(self.instances.values(), self.now, retention)), label="now"
        )
        plan = prune_plan(self.instances.values(), now - timedelta(days=retention))
        self.touch(*self.instances.values())
        self.traced(f"prune retention_days={retention} now={now.isoformat()} dry_run={dry_run}")
        report = self.invoke(lambda: self.target.prune(retention, now, dry_run))
        self.stats.trace[-1] += " -> " + " ".join(f"{k}={report.get(k)}" for k in COUNTS)
        expected = prune(plan, dry_run, self.seen)
        if self.exact_counts:
            self.differ(
                "the prune counts",
                {k: (report.get(k), expected[k]) for k in COUNTS if report.get(k) != expected[k]},
            )
