"""Uniqueness scopes in the fold: duplicates in scope, new runs out of it, held enqueues of a
running job, their limits, and the invariant checker across the runs they make."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evsched.core import bounds, ids, unique
from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    Position,
)
from evsched.core.fold import fold
from evsched.core.invariants import replay
from evsched.core.state import JobState, Status, Verdict

JOB = ids.job_id_for_unique("q", "t", b"[1]")
META = {"job_id": JOB, "emitted_at": 0, "source": "s"}


def enqueue(n: int, scope: str = unique.ACTIVE, **fields: object) -> JobEnqueued:
    fields = {"task": "t", "queue": "q", "args": b"[1]", "unique": scope, **fields}
    return JobEnqueued(event_id=f"e{n}", **META, **fields)  # type: ignore[arg-type]


def lease(token: int) -> JobLeased:
    return JobLeased(event_id=f"l{token}", token=token, attempt=1, lease_ms=1_000, **META)


def start(token: int) -> AttemptStarted:
    return AttemptStarted(event_id=f"s{token}", token=token, worker_id="w", lease_ms=9_000, **META)


def succeed(token: int) -> AttemptSucceeded:
    return AttemptSucceeded(event_id=f"o{token}", token=token, result=b"1", **META)


def run(events: list[JobEvent]) -> tuple[JobState | None, list[tuple[Verdict, str]]]:
    state: JobState | None = None
    seen = []
    for offset, event in enumerate(events):
        state, entry = fold(state, event, Position(partition=0, offset=offset, log_at=offset * 10))
        seen.append((entry.verdict, entry.reason))
    return state, seen


@pytest.mark.parametrize(
    ("scope", "steps", "verdict"),
    [
        (unique.QUEUED, [], Verdict.DUPLICATE),  # scheduled
        (unique.QUEUED, [lease(1)], Verdict.DUPLICATE),  # leased: not started yet
        (unique.ACTIVE, [lease(1)], Verdict.DUPLICATE),
        (unique.ACTIVE, [lease(1), start(1)], Verdict.DUPLICATE),  # running
        (unique.ACTIVE, [lease(1), start(1), succeed(1)], Verdict.APPLIED),  # a new run
        (unique.QUEUED, [lease(1), start(1), succeed(1)], Verdict.APPLIED),
    ],
)
def test_a_second_enqueue_is_a_duplicate_while_the_run_is_in_scope(
    scope: str, steps: list[JobEvent], verdict: Verdict
) -> None:
    state, seen = run([enqueue(1, scope), *steps, enqueue(2, scope)])

    assert seen[-1][0] is verdict
    assert state is not None and state.generation == (1 if verdict is Verdict.APPLIED else 0)
    if verdict is Verdict.APPLIED:
        assert (state.status, state.token, state.unique) == (Status.SCHEDULED, 1, scope)
        assert "run 0 ended (succeeded)" in seen[-1][1]
    else:
        assert seen[-1][1].startswith(f"unique {unique.describe(state)}: run 0 is ")


def test_a_period_holds_from_the_enqueue_whatever_the_status() -> None:
    period = {"unique_period_ms": 45}
    events = [enqueue(1, unique.PERIOD, **period), lease(1), start(1), succeed(1)]
    _, inside = run([*events, enqueue(2, unique.PERIOD, **period)])  # log time 40 < 45
    state, outside = run([*events, succeed(9), enqueue(2, unique.PERIOD, **period)])  # 50

    assert inside[-1] == (Verdict.DUPLICATE, "unique for 45 ms: run 0 is succeeded")
    assert outside[-1][0] is Verdict.APPLIED
    assert state is not None and state.generation == 1


def test_a_passed_period_of_a_run_not_started_yet_is_still_a_duplicate() -> None:
    period = {"unique_period_ms": 5}
    _, seen = run([enqueue(1, unique.PERIOD, **period), enqueue(2, unique.PERIOD, **period)])

    assert seen[-1] == (
        Verdict.DUPLICATE,
        "unique for 5 ms passed, but run 0 has not started yet",
    )


def test_an_enqueue_while_a_queued_scope_runs_is_held_and_starts_when_the_run_ends() -> None:
    events = [enqueue(1, unique.QUEUED), lease(1), start(1)]
    held = enqueue(2, unique.QUEUED, run_at=5)
    state, seen = run([*events, held, enqueue(3, unique.QUEUED), succeed(1)])

    assert seen[3] == (Verdict.APPLIED, "unique while queued: held until run 0 (running) ends")
    assert seen[4] == (Verdict.DUPLICATE, "unique while queued: run 1 is already held")
    assert seen[5] == (
        Verdict.APPLIED,
        "succeeded with token 1; the held enqueue starts run 1",
    )
    assert state is not None
    assert (state.status, state.generation, state.token, state.attempt) == (
        Status.SCHEDULED,
        1,
        1,
        0,
    )
    assert (state.run_at, state.enqueued_at, state.result, state.unique_held_at) == (
        50,
        50,
        None,
        None,
    )


@pytest.mark.parametrize(
    "end",
    [
        JobCancelled(event_id="c", **META),
        AttemptFailed(event_id="f", token=1, error_type="E", message="m", retryable=False, **META),
    ],
)
def test_a_held_enqueue_starts_after_a_cancel_or_a_death_too(end: JobEvent) -> None:
    events = [enqueue(1, unique.QUEUED), lease(1), start(1), enqueue(2, unique.QUEUED), end]
    state, seen = run(events)

    assert seen[-1][1].endswith("; the held enqueue starts run 1")
    assert state is not None and (state.status, state.last_error) == (Status.SCHEDULED, None)


def test_a_held_run_is_not_started_by_a_retry() -> None:
    retried = AttemptFailed(event_id="f", token=1, error_type="E", message="m", **META)
    state, _ = run([enqueue(1, unique.QUEUED), lease(1), start(1), enqueue(2, unique.QUEUED)])
    state, entry = fold(state, retried, Position(partition=0, offset=9, log_at=99))

    assert state is not None and (state.generation, state.unique_held_at) == (0, 30)
    assert entry.reason.startswith("attempt 1 failed (E), retry in")


def test_another_body_under_a_unique_id_is_a_conflict() -> None:
    _, seen = run([enqueue(1), enqueue(2, args=b"[2]")])

    assert seen[-1][0] is Verdict.CONFLICT


def test_a_new_run_keeps_the_token_growing_and_the_checker_sees_one_success_per_run() -> None:
    history = [enqueue(1, unique.QUEUED), lease(1), start(1), enqueue(2, unique.QUEUED)]
    history += [succeed(1), lease(2), start(2), succeed(2), enqueue(3, unique.QUEUED)]
    positions = [Position(partition=0, offset=i, log_at=i * 10) for i in range(len(history))]
    done = replay(zip(history, positions, strict=True))

    assert done.violations == []
    assert [e.verdict for e in done.job_timelines[JOB]] == [Verdict.APPLIED] * len(history)
    state = done.jobs[JOB]
    assert (state.generation, state.token, state.status) == (2, 2, Status.SCHEDULED)


def test_the_checker_still_catches_a_second_success_of_a_run_with_a_held_enqueue() -> None:
    def lax(state: JobState | None, event: JobEvent, position: Position) -> object:
        # A broken fold: a success is applied but leaves the run running, its enqueue held.
        after, entry = fold(state, event, position)
        if isinstance(event, AttemptSucceeded) and state is not None:
            return state, replace(entry, verdict=Verdict.APPLIED)
        return after, entry

    history = [enqueue(1, unique.QUEUED), lease(1), start(1), succeed(1)]
    history += [enqueue(2, unique.QUEUED), replace(succeed(1), event_id="again")]
    positions = [Position(partition=0, offset=i, log_at=i * 10) for i in range(len(history))]
    done = replay(zip(history, positions, strict=True), fold_job=lax)  # type: ignore[arg-type]

    assert [v.invariant for v in done.violations] == ["I1"]


@pytest.mark.parametrize(
    ("scope", "period", "refusal"),
    [
        (None, None, None),
        (unique.QUEUED, None, None),
        (unique.PERIOD, 1, None),
        (None, 5, "unique_period_ms is set without unique 'period'"),
        ("sometimes", None, "unique 'sometimes' is not one of queued, active, period"),
        (unique.ACTIVE, 5, "unique_period_ms is set with unique 'active'"),
        (unique.PERIOD, None, "unique 'period' needs unique_period_ms"),
        (unique.PERIOD, 0, "unique_period_ms 0 is outside [1, 315619200000]"),
    ],
)
def test_the_limits_of_a_scope(scope: str | None, period: int | None, refusal: str | None) -> None:
    event = enqueue(1, scope, unique_period_ms=period)  # type: ignore[arg-type]

    assert bounds.refusal(event) == refusal
    _, seen = run([event])
    assert seen[0][0] is (Verdict.APPLIED if refusal is None else Verdict.REJECTED)


def test_a_unique_id_derives_from_the_body_alone() -> None:
    assert ids.job_id_for_unique("q", "t", b"[1]") == JOB
    assert ids.job_id_for_unique("q", "t", b"[2]") != JOB
    assert ids.job_id_for_unique("r", "t", b"[1]") != JOB
    assert ids.job_id_for_key("q", "k") != ids.job_id_for_unique("q", "t", b"k")
