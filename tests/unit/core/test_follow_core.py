"""The pure rules of following one job (core.follow), failure detail (core.failures), and the fold
rules of fold version 3: reruns of succeeded jobs, categories and tracebacks kept with failures."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evsched.core import bounds, failures
from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobRequeued,
    LeaseExpired,
    Position,
)
from evsched.core.fold import fold
from evsched.core.follow import attempt_current, missed_history, state_before_lease
from evsched.core.state import JobError, JobState, Status, Verdict

DISPATCH = Dispatch(
    job_id="j1",
    token=4,
    attempt=2,
    max_attempts=3,
    task="t",
    queue="q",
    args=b"[]",
    timeout_ms=1_000,
    lease_ms=5_000,
    run_at=100,
    enqueued_at=50,
    leased_at=200,
    partition=0,
    events_offset=7,
)


def at(offset: int, log_at: int = 1_000) -> Position:
    return Position(partition=0, offset=offset, log_at=log_at)


def common(n: int) -> dict[str, object]:
    return {"event_id": f"e{n}", "job_id": "j1", "emitted_at": 0, "source": "s"}


def run(events: list[JobEvent], state: JobState | None = None) -> JobState | None:
    for n, event in enumerate(events):
        state, _ = fold(state, event, at(n, 1_000 + n))
    return state


def succeeded() -> JobState | None:
    return run(
        [
            JobEnqueued(**common(1), task="t", queue="q", args=b"[]"),  # type: ignore[arg-type]
            JobLeased(**common(2), token=1, attempt=1, lease_ms=5_000),  # type: ignore[arg-type]
            AttemptStarted(**common(3), token=1, worker_id="w", lease_ms=5_000),  # type: ignore[arg-type]
            AttemptSucceeded(**common(4), token=1, result=b"42"),  # type: ignore[arg-type]
        ]
    )


# --- core.follow --------------------------------------------------------------------------------


def test_the_state_before_a_lease_is_scheduled_one_token_and_attempt_earlier() -> None:
    state = state_before_lease(DISPATCH)
    assert (state.status, state.token, state.attempt) == (Status.SCHEDULED, 3, 1)
    assert (state.run_at, state.max_attempts, state.partition) == (100, 3, 0)


def test_an_attempt_is_current_until_the_fold_moves_past_its_token() -> None:
    before = state_before_lease(DISPATCH)
    leased, entry = fold(
        before, JobLeased(**common(1), token=4, attempt=2, lease_ms=5_000), at(7, 300)
    )  # type: ignore[arg-type]
    assert entry.verdict is Verdict.APPLIED
    assert attempt_current(before, 4)
    assert attempt_current(leased, 4)
    cancelled, _ = fold(leased, JobCancelled(**common(2)), at(8, 400))  # type: ignore[arg-type]
    assert not attempt_current(cancelled, 4)
    assert not attempt_current(None, 4)
    assert leased is not None
    assert not attempt_current(replace(leased, token=5), 4)


def test_a_cancel_before_the_lease_ends_the_attempt_the_lease_never_got() -> None:
    state = state_before_lease(DISPATCH)
    state, _ = fold(state, JobCancelled(**common(1)), at(7))  # type: ignore[arg-type]
    state, entry = fold(state, JobLeased(**common(2), token=4, attempt=2, lease_ms=5_000), at(8))  # type: ignore[arg-type]
    assert entry.verdict is Verdict.REJECTED
    assert not attempt_current(state, 4)


def test_a_token_the_follow_never_saw_granted_means_it_started_too_late() -> None:
    state = run([JobEnqueued(**common(1), task="t", queue="q", args=b"[]")])  # type: ignore[arg-type]
    late = AttemptSucceeded(**common(2), token=3, result=b"1")  # type: ignore[arg-type]
    _, entry = fold(state, late, at(5))
    assert missed_history(state, entry)
    _, unknown = fold(None, late, at(5))
    assert missed_history(None, unknown)
    enqueue = JobEnqueued(**common(3), task="t", queue="q", args=b"[]")  # type: ignore[arg-type]
    _, first = fold(None, enqueue, at(1))
    assert not missed_history(None, first)
    assert state is not None
    leased = replace(state, token=3, status=Status.SCHEDULED)
    _, old = fold(leased, AttemptSucceeded(**common(4), token=2, result=b"1"), at(6))  # type: ignore[arg-type]
    assert old.verdict is Verdict.STALE
    assert not missed_history(leased, old)


# --- core.failures ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "category"),
    [
        (JobError(error_type="X", message="", retryable=True, category="billing"), "billing"),
        (JobError(error_type="LeaseExpired", message="", retryable=True), "lost_worker"),
        (JobError(error_type="TimeoutError", message="", retryable=True), "timeout"),
        (JobError(error_type="ValueError", message="", retryable=True), "transient"),
        (JobError(error_type="ValueError", message="", retryable=False), "permanent"),
    ],
)
def test_the_category_of_a_failure(error: JobError, category: str) -> None:
    assert failures.category_of(error) == category


@pytest.mark.parametrize("name", ["transient", "billing_api", "a" * 32])
def test_good_category_names(name: str) -> None:
    assert failures.category_refusal(name) is None


@pytest.mark.parametrize("name", ["", "Upper", "with space", "a" * 33, "9lives", "x" * 200])
def test_bad_category_names_are_refused_naming_the_rule(name: str) -> None:
    reason = failures.category_refusal(name)
    assert reason is not None and reason.startswith("category ")


def test_a_long_traceback_is_cut_in_the_middle_with_a_marker() -> None:
    text = "HEAD" + "x" * 40_000 + "TAIL"
    cut = failures.truncate_middle(text)
    assert len(cut) <= failures.MAX_TRACEBACK_CHARS
    assert cut.startswith("HEAD") and cut.endswith("TAIL")
    assert "characters cut]" in cut
    assert failures.truncate_middle("short") == "short"
    tiny = failures.truncate_middle("y" * 100, limit=5)
    assert "characters cut]" in tiny and not tiny.endswith("y")


# --- the fold, version 3 ------------------------------------------------------------------------


def test_a_failure_keeps_its_category_and_traceback_in_the_job_error() -> None:
    state = run(
        [
            JobEnqueued(**common(1), task="t", queue="q", args=b"[]", max_attempts=1),  # type: ignore[arg-type]
            JobLeased(**common(2), token=1, attempt=1, lease_ms=5_000),  # type: ignore[arg-type]
            AttemptStarted(**common(3), token=1, worker_id="w", lease_ms=5_000),  # type: ignore[arg-type]
            AttemptFailed(
                **common(4),  # type: ignore[arg-type]
                token=1,
                error_type="KeyError",
                message="k",
                category="billing",
                traceback="Traceback...",
            ),
        ]
    )
    assert state is not None and state.status is Status.DEAD
    assert state.last_error == JobError(
        error_type="KeyError",
        message="k",
        retryable=True,
        category="billing",
        traceback="Traceback...",
    )


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"traceback": "t" * (failures.MAX_TRACEBACK_CHARS + 1)}, "traceback has"),
        ({"category": "Not A Category"}, "category 'Not A Category'"),
    ],
)
def test_hostile_failure_detail_is_refused_with_a_reason(
    changes: dict[str, str], reason: str
) -> None:
    event = AttemptFailed(**common(1), token=1, error_type="E", message="m", **changes)  # type: ignore[arg-type]
    refused = bounds.refusal(event)
    assert refused is not None and refused.startswith(reason)
    assert bounds.refusal(LeaseExpired(**common(2), token=1)) is None  # type: ignore[arg-type]


def test_a_succeeded_job_goes_back_only_with_rerun() -> None:
    done = succeeded()
    assert done is not None and done.status is Status.SUCCEEDED
    plain = JobRequeued(**common(10))  # type: ignore[arg-type]
    same, entry = fold(done, plain, at(10, 5_000))
    assert (entry.verdict, same) == (Verdict.REJECTED, done)
    assert "needs rerun" in entry.reason
    again, entry = fold(done, replace(plain, rerun=True), at(11, 6_000))
    assert entry.verdict is Verdict.APPLIED and "rerun" in entry.reason
    assert again is not None
    assert (again.status, again.attempt, again.run_at) == (Status.SCHEDULED, 0, 6_000)
    assert again.result is None and again.checkpoint is None and again.token == done.token


def test_rerun_on_a_dead_job_is_a_plain_requeue_and_on_a_running_one_rejected() -> None:
    dead = replace(succeeded(), status=Status.DEAD)  # type: ignore[type-var]
    requeued, entry = fold(dead, JobRequeued(**common(10), rerun=True), at(10))  # type: ignore[arg-type]
    assert entry.verdict is Verdict.APPLIED and "fresh attempt budget" in entry.reason
    assert requeued is not None and requeued.result == b"42"
    running = replace(dead, status=Status.RUNNING)
    _, refused = fold(running, JobRequeued(**common(11), rerun=True), at(11))  # type: ignore[arg-type]
    assert (
        refused.verdict is Verdict.REJECTED and refused.reason == "cannot requeue: job is running"
    )
