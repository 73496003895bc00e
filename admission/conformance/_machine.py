"""The conformance state machine: random sequences of calls to any :class:`Target`, each answer
compared with the reference model.

:func:`machine_for` builds a hypothesis ``RuleBasedStateMachine`` class over a
target.  Each example works on two or three fresh workflow ids (in one or two
namespaces) that share one small pool of keys and one of arguments: runs start,
close and continue as new; signals and updates are admitted, fresh or keyed,
to the instance or to a run; they are retried with the same intent (spelt
otherwise) or a changed one, applied, completed, failed; receipts are read;
closed chains are pruned.  A rule runs only when the target's capabilities
allow it, and after every step the event log of the instances the step
addressed must equal the model's (:data:`~admission.conformance.HISTORY`).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant

from admission.conformance._driver import EPOCH, EPOCHS, SPAN, Options, Stats
from admission.conformance._engine_rules import EngineRules
from admission.conformance._model import Instance, event_view
from admission.conformance._target import CLOCK, HISTORY, LIFECYCLE, PRUNE, Target
from admission.conformance._vocabulary import argument_pool, key_pool

__all__ = ["Options", "Stats", "machine_for"]


class Conformance(EngineRules, RuleBasedStateMachine):
    """The machine; :func:`machine_for` binds it to a target, options and stats."""

    @initialize(
        data=st.data(),
        workflows=st.integers(min_value=2, max_value=3),
        started=st.lists(st.booleans(), min_size=6, max_size=6),
    )
    def setup(self, data: st.DataObject, workflows: int, started: list[bool]) -> None:
        """A fresh example: its words, its instances (most with an open run), its stretch of time."""
        example = self.stats.examples
        self.stats.examples += 1
        self.stats.trace.clear()
        self.rule_name = "setup"
        self.example = example
        self.exact_counts = example < EPOCHS
        self.epoch = EPOCH - (example % EPOCHS) * SPAN
        self.now = self.epoch
        self.target.now = self.now
        self.target.begin(example)
        self.keys = data.draw(key_pool(), label="keys")
        self.arguments = data.draw(argument_pool(), label="arguments")
        names = self.options.namespaces
        # Workflow ids new to this example and this run: examples (and runs against one
        # long-lived server) never meet, even in a store they all share.
        self.instances = {
            (ns, i): Instance(names[ns], f"{self.options.tag}{example}-{i}")
            for ns in range(len(names))
            for i in range(workflows)
        }
        self.checks = 0
        self.touched = set(self.instances)
        if self.allows(LIFECYCLE):
            for where, start in zip(list(self.instances), started, strict=False):
                if start:
                    self.start_run(self.instances[where])

    @invariant()
    def history_agrees_with_the_model(self) -> None:
        """An instance's event log is exactly the model's: the same events, in order, each on its
        run and command (so retained, conflicting and refused calls wrote nothing).

        Checked after every step for the instances the step addressed, and for one more instance
        in turn, so any write that leaked into another instance or namespace is seen within a few
        steps."""
        if not self.allows(HISTORY) or not hasattr(self, "instances"):
            return
        keys = list(self.instances)
        self.checks += 1
        due = {*self.touched, keys[self.checks % len(keys)]}
        for key in keys:
            if key not in due:
                continue
            inst = self.instances[key]
            self.traced(f"history {inst.label}")
            history = self.invoke(lambda inst=inst: self.target.history(inst.namespace, inst.workflow_id))  # type: ignore[misc]
            actual = [event_view(e) for e in history]
            self.stats.trace.pop()  # reads that agree are not part of the story
            if actual != inst.events:
                self.traced(f"history {inst.label} -> {len(actual)} events")
                raise AssertionError(
                    f"{self.rule_name}: the history of {inst.label} differs from the model\n"
                    f"  actual:   {actual}\n  expected: {inst.events}"
                )

    @invariant()
    def pending_commands_wait_in_the_open_run(self) -> None:
        """A pending command always waits in its instance's current, open run (nothing is left
        pending in a closed run: closure rejects it or hands it on)."""
        for inst in getattr(self, "instances", {}).values():
            run = inst.open_run()
            for cmd in inst.commands.values():
                if cmd.pending:
                    assert run is not None and cmd.owner == run.id, (inst.label, cmd.id)


def machine_for(target: Target, options: Options | None = None) -> type[RuleBasedStateMachine]:
    """A state machine class that drives ``target`` and checks every answer against the model.

    Run it with ``hypothesis.stateful.run_state_machine_as_test(machine)`` (or expose its
    ``TestCase`` to a test runner); its class attribute ``stats`` (:class:`Stats`) counts the
    examples, steps, rules and coverage labels, and keeps the trace of the current example."""
    options = options or Options()
    capabilities = frozenset(target.capabilities)
    if len(options.namespaces) not in (1, 2):
        raise ValueError("options.namespaces: one or two namespaces")
    if options.concurrency < 1:
        raise ValueError("options.concurrency: at least 1")
    if PRUNE in capabilities and CLOCK not in capabilities:
        raise ValueError("target.capabilities: pruning needs the clock capability")
    machine = type(
        "Conformance",
        (Conformance,),
        {
            "target": target,
            "options": options,
            "stats": Stats(),
            "capabilities": capabilities,
            "__doc__": f"The conformance machine over {target.name}.",
        },
    )
    configured: type[RuleBasedStateMachine] = settings(
        stateful_step_count=options.steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )(machine)
    return configured
