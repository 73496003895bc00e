"""The job transition table and its pure decisions: states, cycles, publications, pure imports."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.errors import JobStateError
from admission.jobs import (
    FINAL_JOB_STATES,
    JOB_TRANSITIONS,
    JobState,
    PublishedResult,
    find_cycle,
    initial_state,
    job_diagram,
    judge_publication,
)
from admission.jobs import _claims as job_claims
from admission.jobs import _enqueue as job_enqueue
from admission.jobs import _lifecycle as job_lifecycle
from admission.jobs import _memory as job_memory
from admission.jobs import _states as job_states
from admission.jobs import _store as job_store
from admission.jobs import _values as job_values

DOCS = Path(__file__).resolve().parents[2] / "docs"
JOB_STATES_ALL = tuple(JobState)


# -- the table ------------------------------------------------------------------------------------


def test_the_table_uses_exactly_the_contract_states_and_final_states_are_never_left() -> None:
    assert set(JOB_STATES_ALL) == {
        "queued", "running", "retry_wait", "completed", "failed", "cancelled", "recovery_required", "blocked",
    }  # fmt: skip
    used = {s for s, _ in JOB_TRANSITIONS} | set(JOB_TRANSITIONS.values())
    assert used == set(JOB_STATES_ALL)
    assert not {s for s, _ in JOB_TRANSITIONS} & FINAL_JOB_STATES
    # Every state is reachable from a start state.
    reached, frontier = {"queued", "blocked"}, ["queued", "blocked"]
    while frontier:
        state = frontier.pop()
        for (before, _), after in JOB_TRANSITIONS.items():
            if before == state and after not in reached:
                reached.add(after)
                frontier.append(after)
    assert reached == set(JOB_STATES_ALL)


@given(st.sampled_from(JOB_STATES_ALL), st.sampled_from([*JOB_TRANSITIONS.events, "bogus"]))
@settings(max_examples=200)
def test_next_state_applies_the_table_and_refuses_every_other_pair(state: str, event: str) -> None:
    if (state, event) in JOB_TRANSITIONS:
        assert JOB_TRANSITIONS.next_state(state, event) == JOB_TRANSITIONS[(state, event)]
    else:
        with pytest.raises(JobStateError) as refused:
            JOB_TRANSITIONS.next_state(state, event, subject="j")
        assert (refused.value.state, refused.value.event, refused.value.code) == (state, event, "job_state")


def test_docs_hold_exactly_the_rendered_diagram() -> None:
    document = (DOCS / "jobs.md").read_text(encoding="utf-8")
    rendered = job_diagram()
    assert rendered in document
    assert document.count("```mermaid") == 1
    for (before, event), after in JOB_TRANSITIONS.items():
        assert f"    {before} --> {after}: {event}\n" in rendered


@pytest.mark.parametrize("module", [job_states, job_values])
def test_the_pure_job_modules_import_no_sqlalchemy(module: ModuleType) -> None:
    source = Path(str(module.__file__)).read_text(encoding="utf-8")
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom)
    }
    assert "sqlalchemy" not in imported and imported <= {
        "__future__",
        "collections",
        "dataclasses",
        "datetime",
        "enum",
        "typing",
        "admission",
    }


@given(st.lists(st.sampled_from(JOB_STATES_ALL), max_size=5))
def test_a_job_starts_queued_only_when_every_dependency_completed(states: list[str]) -> None:
    assert (initial_state(states) == "queued") == all(s == "completed" for s in states)


# -- cycles ---------------------------------------------------------------------------------------


def _acyclic_by_kahn(edges: dict[str, list[str]]) -> bool:
    nodes = set(edges) | {d for ds in edges.values() for d in ds}
    indegree = dict.fromkeys(nodes, 0)
    for deps in edges.values():
        for dep in deps:
            indegree[dep] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for dep in edges.get(node, []):
            indegree[dep] -= 1
            if indegree[dep] == 0:
                ready.append(dep)
    return seen == len(nodes)


graphs = st.dictionaries(
    st.sampled_from("abcdefg"), st.lists(st.sampled_from("abcdefg"), unique=True, max_size=3), max_size=7
)


@given(graphs)
@settings(max_examples=300)
def test_find_cycle_finds_a_real_cycle_exactly_when_there_is_one(edges: dict[str, list[str]]) -> None:
    cycle = find_cycle(edges)
    assert (cycle is None) == _acyclic_by_kahn(edges)
    if cycle is not None:
        assert cycle[0] == cycle[-1] and len(cycle) >= 2
        for here, there in itertools.pairwise(cycle):
            assert there in edges[here]


def test_a_long_chain_has_no_cycle_and_closing_it_makes_one() -> None:
    chain = {f"n{i}": [f"n{i + 1}"] for i in range(5000)}
    assert find_cycle(chain) is None
    chain["n5000"] = ["n0"]
    assert find_cycle(chain) == [*(f"n{i}" for i in range(5001)), "n0"]


# -- publications ---------------------------------------------------------------------------------

publications = st.lists(
    st.builds(
        PublishedResult,
        st.sampled_from(["j", "k"]),
        st.sampled_from(["a1", "a2"]),
        st.sampled_from([b"x", b"y"]),
    ),
    max_size=3,
)


@given(publications)
@settings(max_examples=200)
def test_only_exactly_one_matching_publication_is_consistent(published: list[PublishedResult]) -> None:
    verdict = judge_publication("j", "a1", b"x", published)
    if not published:
        assert verdict == "absent"
    elif published == [PublishedResult("j", "a1", b"x")]:
        assert verdict == "consistent"
    else:
        assert verdict == "inconsistent"


@pytest.mark.parametrize("module", [job_store, job_memory, job_claims, job_lifecycle, job_enqueue])
def test_the_job_port_its_memory_store_and_the_rules_import_no_sqlalchemy_and_no_io(
    module: ModuleType,
) -> None:
    source = Path(str(module.__file__)).read_text(encoding="utf-8")
    imported = {
        alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module or "" for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert {name.split(".")[0] for name in imported} <= {
        "__future__",
        "collections",
        "contextlib",
        "dataclasses",
        "datetime",
        "hashlib",  # a pure computation: a checkpoint's digest in a snapshot (admission.jobs._store)
        "threading",
        "typing",
        "admission",
    }
    assert not {name for name in imported if name.startswith("admission.sql")}
