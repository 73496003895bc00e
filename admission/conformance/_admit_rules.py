"""The machine's admission rules: fresh signals and updates, retries, receipts (contract §2, §4).

Every answer is predicted by the model: a key with a receipt is answered from
it (the same intent: the receipt in its current state; another intent: a
conflict naming the parts that differ), anything else is a fresh command,
placed by the target rules of §4.
"""

from __future__ import annotations

from typing import Final

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from admission.conformance._driver import Driver, fresh_command
from admission.conformance._model import (
    Command,
    Instance,
    conflict_parts,
    expected_conflict,
    expected_receipt,
    model_key,
    placement,
)
from admission.conformance._target import CommandType
from admission.conformance._vocabulary import NAMES, argument_twins, key_twins, same_encoding
from admission.intent._encoding import canonical_encode

__all__ = ["ANYONE", "AdmissionRules"]

ANYONE: Final = st.integers(min_value=0, max_value=4).map(lambda n: n == 0)
"""Mostly a call goes where it fits (an open run, a pending command); now and then anywhere."""
# Instance scope half the time; run scope naming the current run, an older one, or another
# instance's run.
AIMS: Final = ("instance", "instance", "instance", "current", "older", "foreign")
# Which earlier receipt a retry names.
RECEIPT_KINDS: Final = ("any", "pending", "applied", "completed", "rejected or failed", "refused", "pruned")
COMMAND_TYPES: Final[tuple[CommandType, ...]] = ("signal", "update")

Keyed = tuple[tuple[int, int], str, str]


class AdmissionRules(Driver):
    """Signals, updates, retries with the same or a changed intent, and receipt reads."""

    def admit(
        self,
        inst: Instance,
        command_type: CommandType,
        sent_key: str | None,
        name: str,
        arguments: object,
        target: str | None,
    ) -> None:
        """Send one admission and compare every answer with the model's."""
        self.touch(inst)
        key = model_key(sent_key, self.target.strips_keys)
        encoded = canonical_encode(arguments)
        cmd = inst.receipt_of(command_type, key)
        lost = self.options.lost_responses and key is not None
        answers, lost_id = self.admission(
            inst, command_type, sent_key, name, arguments, target, keyed=key is not None
        )
        if cmd is not None and key is not None:
            parts = conflict_parts(cmd, name, encoded, target)
            if not parts:
                # §4: the same intent: the original receipt, in its current state; nothing written.
                self.seen(f"retained {cmd.answer_outcome}")
                for answer in answers:
                    self.compare("the retained receipt", answer, expected_receipt(inst, cmd, retained=True))
                return
            # §4: another intent: 409 naming the parts that differ; nothing written, key kept.
            self.seen("conflict")
            for answer in answers:
                self.compare("the conflict", answer, expected_conflict(inst, command_type, key, cmd, parts))
            return
        # No receipt (or no key): a fresh command, placed by the target rules of §4.
        if key is not None and any(c.type == command_type and c.key == key for c in inst.pruned):
            self.seen("fresh again after pruning")  # §5: after pruning the key is free again
        place = placement(inst, command_type, target)
        self.seen(f"fresh {place[0]}")
        primary, others = answers[0], answers[1:]
        if len(answers) > 1:
            # N clients at once on one new key: exactly one admits, the others get its receipt.
            fresh = [a for a in answers if a.body.get("retained") is not True]
            self.differ("the concurrent answers", {"fresh answers": (len(fresh), 1)}, len(fresh) != 1)
            primary, others = fresh[0], [a for a in answers if a is not fresh[0]]
        spec = (command_type, key, name, arguments, encoded, target)
        new = fresh_command(self, inst, primary.body, spec, place)
        if lost:
            # The lost answer's command: the retry must be its receipt, not a second command.
            self.differ("the retry after a lost answer", {"command_id": (new.id, lost_id)}, new.id != lost_id)
            self.compare("the retry after a lost answer", primary, expected_receipt(inst, new, retained=True))
        else:
            self.compare("the fresh answer", primary, expected_receipt(inst, new, retained=False))
        for answer in others:
            self.compare("a concurrent client's answer", answer, expected_receipt(inst, new, retained=True))
        inst.record(new)

    def aim(self, inst: Instance, aim: str, data: st.DataObject) -> str | None:
        """The run a command selects: none (instance scope), the current, an older or a foreign one."""
        if aim == "current":
            return inst.current
        if aim == "older" and inst.all_run_ids:
            return data.draw(st.sampled_from(inst.all_run_ids), label="older run")
        if aim == "foreign":
            foreign = [r for i in self.instances.values() if i is not inst for r in i.all_run_ids]
            return data.draw(st.sampled_from(foreign), label="foreign run") if foreign else "no-such-run"
        return None

    def send_new(self, data: st.DataObject, command_type: CommandType, anyone: bool, aim: str) -> None:
        """A command with words drawn from the example's pools."""
        inst = self.choose(data, anyone, self.open_instances())
        key = data.draw(st.one_of(st.none(), st.sampled_from(self.keys)), label="key")
        name = data.draw(st.sampled_from(NAMES), label="name")
        arguments = data.draw(st.sampled_from(self.arguments), label="arguments")
        self.admit(inst, command_type, key, name, arguments, self.aim(inst, aim, data))

    @rule(data=st.data(), anyone=ANYONE, aim=st.sampled_from(AIMS))
    def signal(self, data: st.DataObject, anyone: bool, aim: str) -> None:
        """A signal, keyed or not, to the instance or to a run (current, older, another instance's)."""
        self.step("signal")
        self.send_new(data, "signal", anyone, aim)

    @rule(data=st.data(), anyone=ANYONE, aim=st.sampled_from(AIMS))
    def update(self, data: st.DataObject, anyone: bool, aim: str) -> None:
        """An update, keyed or not, to the instance or to a run (current, older, another instance's)."""
        self.step("update")
        self.send_new(data, "update", anyone, aim)

    # -- retries ---------------------------------------------------------------------------------

    def keyed(self, include_pruned: bool) -> list[Keyed]:
        """Every keyed command (where, id, kind): the live receipts, and the pruned ones."""
        found = []
        for where, inst in self.instances.items():
            for cmd_id in inst.receipts.values():
                cmd = inst.commands[cmd_id]
                kind = (
                    "refused"
                    if cmd.refused
                    else "pending"
                    if cmd.pending
                    # Two kinds, not one: a retry of a completed update must turn up
                    # in every long run ("retained completed").
                    else cmd.status
                    if cmd.status in ("applied", "completed")
                    else "rejected or failed"
                )
                found.append((where, cmd_id, kind))
            if include_pruned:
                found += [(where, c.id, "pruned") for c in inst.pruned if c.key is not None]
        return found

    def command(self, where: tuple[int, int], command_id: str) -> Command:
        """A command of the model, live or pruned."""
        inst = self.instances[where]
        return inst.commands.get(command_id) or next(c for c in inst.pruned if c.id == command_id)

    @precondition(lambda self: self.keyed(include_pruned=True))
    @rule(data=st.data(), kind=st.sampled_from(RECEIPT_KINDS))
    def retry_same(self, data: st.DataObject, kind: str) -> None:
        """An earlier key with the identical intent: its receipt (after pruning: a fresh command)."""
        self.step("retry_same")
        found = self.keyed(include_pruned=True)
        self.retry(data, [f for f in found if f[2] == kind] or found)

    @precondition(lambda self: any(kind == "completed" for *_, kind in self.keyed(include_pruned=False)))
    @rule(data=st.data())
    def retry_completed(self, data: st.DataObject) -> None:
        """A retry of a completed update: its result again.  A rule of its own, not only a kind
        ``retry_same`` may draw, so that every run meets it however rare keyed completions are."""
        self.step("retry_completed")
        self.retry(data, [f for f in self.keyed(include_pruned=False) if f[2] == "completed"])

    def retry(self, data: st.DataObject, found: list[Keyed]) -> None:
        """Send one of ``found`` again with the same intent, its arguments maybe spelt otherwise."""
        where, command_id, _ = data.draw(st.sampled_from(found), label="receipt")
        cmd = self.command(where, command_id)
        same = same_encoding(cmd.raw_arguments, self.arguments)
        arguments = data.draw(st.sampled_from(same), label="arguments")
        self.admit(self.instances[where], cmd.type, cmd.key, cmd.name, arguments, cmd.target)  # type: ignore[arg-type]

    @precondition(lambda self: self.keyed(include_pruned=False))
    @rule(data=st.data(), parts=st.sets(st.sampled_from(("name", "arguments", "target")), min_size=1))
    def retry_changed(self, data: st.DataObject, parts: set[str]) -> None:
        """An earlier key with a changed name, arguments or target: a conflict on exactly those.
        Changed arguments are often the value's twin (``1.0`` for ``1``, ``-0.0`` for ``0.0``)."""
        self.step("retry_changed")
        where, command_id, _ = data.draw(st.sampled_from(self.keyed(include_pruned=False)), label="receipt")
        inst = self.instances[where]
        cmd = inst.commands[command_id]
        name = next(n for n in NAMES if n != cmd.name) if "name" in parts else cmd.name
        arguments = cmd.raw_arguments
        others = [a for a in self.arguments if canonical_encode(a) != cmd.arguments]
        if "arguments" in parts and others:
            twins = argument_twins(cmd.raw_arguments, self.arguments)
            if twins and data.draw(st.integers(min_value=0, max_value=2), label="twin") > 0:
                arguments = data.draw(st.sampled_from(twins), label="twin arguments")
            else:
                arguments = data.draw(st.sampled_from(others), label="changed arguments")
        target = cmd.target
        if "target" in parts:
            twin = self.other(inst)
            choices = [None, "no-such-run", *inst.all_run_ids, *(twin.all_run_ids if twin else [])]
            target = data.draw(
                st.sampled_from([t for t in choices if t != cmd.target]), label="changed target"
            )
        self.admit(inst, cmd.type, cmd.key, name, arguments, target)  # type: ignore[arg-type]

    def twinned(self) -> list[tuple[Keyed, str]]:
        """Keyed commands whose key has a twin in the pool (case, normalisation, whitespace)."""
        return [
            (found, twin)
            for found in self.keyed(include_pruned=False)
            for twin in key_twins(self.command(found[0], found[1]).key or "", self.keys)
        ]

    @precondition(lambda self: self.twinned())
    @rule(data=st.data())
    def retry_twin_key(self, data: st.DataObject) -> None:
        """An earlier intent under its key's twin: another key (contract §2: keys are compared
        as they are), unless the target strips keys and the twins differ only by whitespace."""
        self.step("retry_twin_key")
        (where, command_id, _), twin = data.draw(st.sampled_from(self.twinned()), label="twin key")
        cmd = self.command(where, command_id)
        self.seen("twin key")
        self.admit(self.instances[where], cmd.type, twin, cmd.name, cmd.raw_arguments, cmd.target)  # type: ignore[arg-type]

    def twinned_arguments(self) -> list[tuple[Keyed, object]]:
        """Keyed commands whose arguments have a twin in the pool (``[1.0]`` for ``[1]``)."""
        return [
            (found, twin)
            for found in self.keyed(include_pruned=False)
            for twin in argument_twins(self.command(found[0], found[1]).raw_arguments, self.arguments)
        ]

    @precondition(lambda self: self.twinned_arguments())
    @rule(data=st.data())
    def retry_twin_arguments(self, data: st.DataObject) -> None:
        """An earlier key with its arguments' twin (``1.0`` for ``1``, ``-0.0`` for ``0.0``):
        another value (contract §3), so a conflict on the arguments.  A rule of its own, not
        only a choice ``retry_changed`` may make, so that every run meets the twins of the
        values its receipts hold, however rare they are in the pool."""
        self.step("retry_twin_arguments")
        (where, command_id, _), twin = data.draw(st.sampled_from(self.twinned_arguments()), label="twin")
        cmd = self.command(where, command_id)
        self.seen("twin arguments")
        self.admit(self.instances[where], cmd.type, cmd.key, cmd.name, twin, cmd.target)  # type: ignore[arg-type]

    @rule(data=st.data(), command_type=st.sampled_from(COMMAND_TYPES))
    def read_receipt(self, data: st.DataObject, command_type: CommandType) -> None:
        """Reading a receipt answers what a retry would, and writes nothing."""
        self.step("read_receipt")
        inst = self.choose(data, True, [])
        sent = data.draw(st.sampled_from(self.keys), label="key")
        key = model_key(sent, self.target.strips_keys)
        if key is None:
            return  # a blank key names no receipt where keys are stripped; nothing to read
        self.touch(inst)
        self.traced(f"receipt {command_type} {inst.label} key={sent!r}")
        answer = self.invoke(
            lambda: self.target.receipt(inst.namespace, inst.workflow_id, command_type, sent)
        )
        self.stats.trace[-1] += f" -> {'none' if answer is None else answer.body.get('outcome')}"
        cmd = inst.receipt_of(command_type, key)
        if cmd is None:
            self.differ(
                "the receipt read", {"receipt": (answer and dict(answer.body), None)}, answer is not None
            )
            return
        self.compare("the receipt read", answer, expected_receipt(inst, cmd, retained=True))
