"""Cycles of jobs waiting on one another: found in a batch before it is written
(``graph.waiting_cycle``), and, written anyway by a foreign producer, a cycle of two is broken by
the fold (``waits.registered``) so neither job waits for ever."""

from __future__ import annotations

from typing import Any

import pytest

from evsched.core.events import ChildRegistered, Position
from evsched.core.fold import fold
from evsched.core.state import JobState, Status, Verdict
from evsched.core.workflow import waits as workflows
from evsched.core.workflow.graph import waiting_cycle
from tests.unit.core.workflow.test_workflows import T0, enqueue, register, resolve, run


@pytest.mark.parametrize(
    ("after", "cycle"),
    [
        ({}, None),
        ({"a": (), "b": ("a",), "c": ("a", "b")}, None),  # a chain and a group: no cycle
        ({"c": ("b",), "b": ("a",), "a": ()}, None),  # children first: each parent walked once
        ({"b": ("a", "x"), "c": ("b", "x")}, None),  # parents outside the batch are not followed
        ({"a": ("a",)}, ("a", "a")),
        ({"a": ("b",), "b": ("a",)}, ("a", "b", "a")),
        ({"x": (), "a": ("x", "b"), "b": ("c",), "c": ("a",)}, ("a", "b", "c", "a")),
        ({"d": ("a",), "a": ("b",), "b": ("c",), "c": ("b",)}, ("b", "c", "b")),
    ],
)
def test_a_cycle_is_named_in_wait_order(
    after: dict[str, tuple[str, ...]], cycle: tuple[str, ...] | None
) -> None:
    assert waiting_cycle(after) == cycle


def _registered(parent: JobState, child: str, offset: int) -> tuple[JobState | None, Any]:
    return fold(
        parent,
        register(parent.job_id, child),
        Position(partition=0, offset=offset, log_at=T0 + offset),
    )


def _answer(parent: JobState, event: ChildRegistered, verdict: Verdict) -> list[Any]:
    pos = Position(partition=0, offset=9, log_at=T0 + 9)
    return workflows.resolutions_to_send(parent, parent, event, verdict, pos=pos, source="node-1")


def test_a_cycle_of_two_is_refused_by_both_parents_and_neither_waits() -> None:
    # A foreign producer's batch: a waits on b and b on a, each registered with the other.
    a, _ = run(enqueue("a", "b"))
    b, _ = run(enqueue("b", "a"))
    assert a is not None and b is not None and a.status is Status.WAITING
    after, entry = _registered(b, "a", 5)
    assert after == b and entry.verdict is Verdict.REJECTED
    assert entry.reason == "cycle: this job waits on a, so a cannot wait on it"
    [answer] = _answer(b, register("b", "a"), entry.verdict)
    assert (answer.job_id, answer.parent_id, answer.outcome) == ("a", "b", "refused")
    # Its rule (all_succeeded) can no longer be met: the child ends, and so does its parent's
    # wait on it when that answer reaches it too.
    a, entries = run(resolve("a", "b", outcome="refused", result=None), state=a)
    assert a is not None and a.status is Status.CANCELLED
    assert "can no longer be met, cancelled" in entries[-1].reason


def test_a_job_that_does_not_wait_on_its_child_takes_it() -> None:
    a, _ = run(enqueue("a", "x"))
    assert a is not None
    after, entry = _registered(a, "c", 1)
    assert entry.verdict is Verdict.APPLIED and after is not None and after.children == ("c",)


def test_a_longer_cycle_is_not_seen_by_any_one_fold_and_its_jobs_wait() -> None:
    """A design choice, pinned (docs/job-lifecycle.md, "Cycles"): a cycle of three written by a
    foreign producer spans states no one fold reads together, so each registration is applied
    and the jobs wait until an operator cancels them (``evsched workflow cancel``)."""
    a, _ = run(enqueue("a", "c"))
    b, _ = run(enqueue("b", "a"))
    c, _ = run(enqueue("c", "b"))
    for parent, child in ((a, "b"), (b, "c"), (c, "a")):
        assert parent is not None
        after, entry = _registered(parent, child, 3)
        assert entry.verdict is Verdict.APPLIED, entry.reason
        assert after is not None and after.status is Status.WAITING
