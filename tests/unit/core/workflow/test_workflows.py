"""core.workflow.waits: registrations, resolutions, rules and result placement, as functions."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from evsched.core import bounds
from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    ChildRegistered,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    ParentResolved,
    Position,
)
from evsched.core.fold import fold
from evsched.core.invariants import replay
from evsched.core.state import JobState, Resolution, Status, Verdict
from evsched.core.workflow import waits as workflows

T0 = 1_000_000
_seq = itertools.count()


def _meta(job_id: str) -> dict[str, Any]:
    return {"event_id": f"e{next(_seq)}", "job_id": job_id, "emitted_at": 0, "source": "test"}


def enqueue(job_id: str, *after: str, **over: Any) -> JobEnqueued:
    fields: dict[str, Any] = {"task": "t", "queue": "q", "args": b'{"args":[0],"kwargs":{}}'}
    return JobEnqueued(**_meta(job_id), **{**fields, "after": after, **over})


def register(parent: str, child: str) -> ChildRegistered:
    return ChildRegistered(**_meta(parent), child_id=child)


def resolve(child: str, parent: str, outcome: str = "succeeded", result: bytes | None = b"5"):  # type: ignore[no-untyped-def]
    return ParentResolved(
        **_meta(child), parent_id=parent, outcome=outcome, parent_partition=2, parent_offset=9,
        result=result,
    )  # fmt: skip


def run(*events: JobEvent, state: JobState | None = None) -> tuple[JobState | None, list[Any]]:
    entries = []
    for offset, event in enumerate(events):
        state, entry = fold(state, event, Position(partition=0, offset=offset, log_at=T0 + offset))
        entries.append(entry)
    return state, entries


def test_a_child_waits_until_its_rule_releases_it() -> None:
    state, entries = run(enqueue("c", "a", "b", results_to_args="list"), resolve("c", "a"))
    assert state is not None and state.status is Status.WAITING
    assert "waiting on 1 more" in entries[-1].reason
    state, entries = run(resolve("c", "b", result=None), state=state)
    assert state is not None and state.status is Status.SCHEDULED
    assert state.args == b'{"args":[0,[5,null]],"kwargs":{}}'
    assert state.run_at == T0  # due now (log time), not before
    assert [r.parent_id for r in state.resolutions] == ["a", "b"]
    assert entries[-1].reason == "parent b succeeded at 2@9: rule all_succeeded met, released"


def test_a_repeat_or_a_stranger_is_refused() -> None:
    state, entries = run(enqueue("c", "a"), resolve("c", "x"), resolve("c", "a"))
    assert entries[1].verdict is Verdict.REJECTED and "does not wait on x" in entries[1].reason
    state, entries = run(resolve("c", "a"), state=state)
    assert entries[0].verdict is Verdict.DUPLICATE
    _, entries = run(resolve("nobody", "a"))
    assert entries[0].verdict is Verdict.REJECTED and entries[0].reason == "unknown job"


def test_a_resolution_after_release_or_cancel_is_recorded_only() -> None:
    state, _ = run(
        enqueue("c", "a", "b", after_rule="any_succeeded"), resolve("c", "a"), resolve("c", "b")
    )
    assert state is not None and state.status is Status.SCHEDULED
    assert len(state.resolutions) == 2
    state, _ = run(enqueue("d", "a"), JobCancelled(**_meta("d")), resolve("d", "a"))
    assert state is not None and state.status is Status.CANCELLED
    assert state.resolutions[0].parent_id == "a"


def test_a_failed_parent_cancels_an_all_succeeded_child() -> None:
    state, entries = run(enqueue("c", "a", "b"), resolve("c", "a", "dead", None))
    assert state is not None and state.status is Status.CANCELLED
    assert entries[-1].reason.endswith("rule all_succeeded can no longer be met, cancelled")


def test_args_that_cannot_take_results_cancel_the_child() -> None:
    state, entries = run(enqueue("c", "a", args=b"[]", results_to_args="append"), resolve("c", "a"))
    assert state is not None and state.status is Status.CANCELLED
    assert "cannot pass the results" in entries[-1].reason


@pytest.mark.parametrize(
    ("rule", "outcomes", "expected"),
    [
        ("all_succeeded", ["succeeded"], "wait"),
        ("all_succeeded", ["succeeded", "succeeded"], "release"),
        ("all_succeeded", ["dead"], "give_up"),
        ("all_finished", ["dead"], "wait"),
        ("all_finished", ["dead", "cancelled"], "release"),
        ("any_succeeded", ["dead"], "wait"),
        ("any_succeeded", ["dead", "succeeded"], "release"),
        ("any_succeeded", ["dead", "unknown"], "give_up"),
    ],
)
def test_rules(rule: str, outcomes: list[str], expected: str) -> None:
    done = tuple(
        Resolution(parent_id=p, outcome=o, partition=0, offset=i)
        for i, (p, o) in enumerate(zip("ab", outcomes, strict=False))
    )
    assert workflows.rule_outcome(rule, ("a", "b"), done) == expected


def test_result_placement() -> None:
    done = (Resolution(parent_id="a", outcome="succeeded", partition=0, offset=0, result=b'"x"'),)
    args = b'{"args":[1],"kwargs":{"k":2}}'
    assert workflows.released_args(args, ("a",), done, "none") == args
    appended = workflows.released_args(args, ("a", "b"), done, "append")
    assert appended == b'{"args":[1,"x",null],"kwargs":{"k":2}}'
    assert workflows.released_args(b"{}", ("a",), done, "list") == "KeyError: 'args'"
    assert isinstance(workflows.released_args(b"\xff", ("a",), done, "list"), str)
    bad = (Resolution(parent_id="a", outcome="succeeded", partition=0, offset=0, result=b"NaN"),)
    assert isinstance(workflows.released_args(args, ("a",), bad, "list"), str)


def _parent_to(status: str) -> list[JobEvent]:
    lease = JobLeased(**_meta("p"), token=1, attempt=1, lease_ms=60_000)
    start = AttemptStarted(**_meta("p"), token=1, worker_id="w", lease_ms=60_000)
    if status == "succeeded":
        end: JobEvent = AttemptSucceeded(**_meta("p"), token=1, result=b"1")
    else:
        end = AttemptFailed(**_meta("p"), token=1, error_type="E", message="m", retryable=False)
    return [enqueue("p"), register("p", "c"), lease, start, end]


def sends(before: JobState | None, event: JobEvent, offset: int = 50) -> list[ParentResolved]:
    position = Position(partition=3, offset=offset, log_at=T0 + 100)
    after, entry = fold(before, event, position)
    return workflows.resolutions_to_send(
        before, after, event, entry.verdict, pos=position, source="node-1"
    )


@pytest.mark.parametrize("status", ["succeeded", "dead"])
def test_an_applied_end_sends_one_resolution_per_child(status: str) -> None:
    events = _parent_to(status)
    before, _ = run(*events[:-1])
    [sent] = sends(before, events[-1])
    assert (sent.job_id, sent.parent_id, sent.outcome) == ("c", "p", status)
    assert sent.result == (b"1" if status == "succeeded" else None)
    assert (sent.parent_partition, sent.parent_offset, sent.source) == (3, 50, "node-1")
    assert sent.event_id == sends(before, events[-1])[0].event_id  # a refold makes the same id
    ended, _ = run(events[-1], state=before)
    assert sends(ended, events[-1]) == []  # a repeat of the end: not applied again


def test_a_stale_or_rejected_end_sends_nothing() -> None:
    before, _ = run(*_parent_to("succeeded")[:-1])
    stale = AttemptSucceeded(**_meta("p"), token=0, result=b"1")
    assert sends(before, stale) == []
    assert sends(before, JobLeased(**_meta("p"), token=1, attempt=1, lease_ms=1)) == []
    lone, _ = run(enqueue("q"))
    assert sends(lone, JobCancelled(**_meta("q"))) == []  # ended, but no children


def test_registrations_are_answered_at_once_when_they_cannot_wait() -> None:
    ended, _ = run(*_parent_to("dead"))
    [late] = sends(ended, register("p", "late"))
    assert (late.job_id, late.outcome) == ("late", "dead")
    [unknown] = sends(None, register("ghost", "c"))
    assert (unknown.parent_id, unknown.outcome) == ("ghost", "unknown")
    assert sends(ended, register("p", "c")) == []  # duplicate: answered the first time
    assert sends(None, register("ghost", "ghost")) == []  # refused by the limits: nothing
    live, _ = run(enqueue("p"))
    assert sends(live, register("p", "c")) == []  # waits for the end


def test_a_parent_takes_at_most_max_children(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounds, "MAX_CHILDREN", 1)
    state, entries = run(enqueue("p"), register("p", "a"), register("p", "a"))
    assert entries[-1].verdict is Verdict.DUPLICATE
    [refused] = sends(state, register("p", "b"))
    assert refused.outcome == "refused"
    _, entries = run(register("p", "b"), state=state)
    assert entries[0].verdict is Verdict.REJECTED and "limit is 1" in entries[0].reason


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (enqueue("j", *(f"p{i}" for i in range(1_001))), "after has 1001 parents"),
        (enqueue("j", "j"), "after names the job itself"),
        (enqueue("j", "a", "a"), "after names a parent twice"),
        (enqueue("j", "a", after_rule="some"), "after_rule 'some' is not one of"),
        (enqueue("j", "a", results_to_args="x"), "results_to_args 'x' is not one of"),
        (enqueue("j", ""), "after[] must not be empty"),
        (register("j", "j"), "child_id is the job itself"),
        (register("j", ""), "child_id must not be empty"),
        (resolve("j", "p", "maybe"), "outcome 'maybe' is not one of"),
        (resolve("j", ""), "parent_id must not be empty"),
    ],
)
def test_hostile_workflow_fields_are_refused(event: JobEvent, reason: str) -> None:
    refusal = bounds.refusal(event)
    assert refusal is not None and refusal.startswith(reason)
    _, entries = run(event)
    assert entries[0].verdict is Verdict.REJECTED


def test_only_the_transition_to_an_end_sends() -> None:
    before, _ = run(*_parent_to("succeeded")[:-2])  # leased, with a child
    start = AttemptStarted(**_meta("p"), token=1, worker_id="w", lease_ms=60_000)
    assert sends(before, start) == []  # applied, not an end
    cancelled, _ = run(
        enqueue("m", "a", "b"), register("m", "c"), JobCancelled(**_meta("m")), resolve("m", "a")
    )
    assert cancelled is not None and cancelled.status is Status.CANCELLED
    assert sends(cancelled, resolve("m", "b")) == []  # recorded on an ended job: sent already


def _history(*events: JobEvent, partition: int = 0) -> list[tuple[JobEvent, Position]]:
    return [
        (e, Position(partition=partition, offset=i, log_at=T0 + i)) for i, e in enumerate(events)
    ]


def test_i8_holds_for_a_release_by_an_accepted_end() -> None:
    parent = _parent_to("succeeded")
    history = _history(*parent, partition=1)
    [sent] = sends(run(*parent[:-1])[0], parent[-1], offset=4)
    sent = replace(sent, parent_partition=1)
    history += _history(enqueue("c", "p"), sent)
    assert replay(history).violations == []


def test_i8_catches_a_release_by_a_stale_end_or_a_second_one() -> None:
    parent = _parent_to("succeeded")
    stale = AttemptSucceeded(**_meta("p"), token=0, result=b"1")
    history = _history(*parent[:-1], stale, partition=1)  # offset 4: the stale success
    forged = replace(resolve("c", "p"), parent_partition=1, parent_offset=4)
    history += _history(enqueue("c", "p"), forged)
    [violation] = replay(history).violations
    assert violation.invariant == "I8" and "not an accepted end" in violation.detail
    nowhere = replace(resolve("c", "p"), parent_partition=7, parent_offset=0)
    [violation] = replay(_history(enqueue("c", "p"), nowhere)).violations
    assert "holds no record of parent p" in violation.detail


def test_i8_does_not_trust_the_fold(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = _parent_to("dead")
    history = _history(*parent, partition=1)
    good = replace(resolve("c", "p", "dead", None), parent_partition=1, parent_offset=4)
    wrong = replace(good, outcome="succeeded")
    [violation] = replay([*history, *_history(enqueue("c", "p"), wrong)]).violations
    assert "outcome succeeded, but the parent became dead" in violation.detail

    def lenient(state: JobState | None, event: JobEvent, pos: Position) -> Any:
        if isinstance(event, ParentResolved) and state is not None:
            again = replace(state, resolutions=())  # a fold that forgets: a second release
            return fold(again, event, pos)
        return fold(state, event, pos)

    twice = _history(enqueue("c", "p", "q"), good, replace(good, event_id="other"))
    found = replay([*history, *twice], fold_job=lenient).violations
    assert [v.detail for v in found] == ["ParentResolved: resolved by this parent again"]


def test_i8_checks_the_answer_to_a_registration() -> None:
    ended = _parent_to("succeeded")
    late = register("p", "c2")
    history = _history(*ended, late, partition=1)
    answer = replace(resolve("c2", "p", result=b"1"), parent_partition=1, parent_offset=5)
    assert replay([*history, *_history(enqueue("c2", "p"), answer)]).violations == []
    other = replace(answer, job_id="d")
    found = replay([*history, *_history(enqueue("d", "p"), other)]).violations
    assert "registration at 1@5 is of another child" in found[0].detail
    ghost = _history(register("ghost", "c"), partition=2)
    unknown = replace(resolve("c", "ghost", "unknown", None), parent_partition=2, parent_offset=0)
    assert replay([*ghost, *_history(enqueue("c", "ghost"), unknown)]).violations == []
    lying = replace(unknown, outcome="dead")
    found = replay([*ghost, *_history(enqueue("c", "ghost"), lying)]).violations
    assert "does not answer the registration" in found[0].detail
