"""Snoozes (core.snooze): a handler's "again in N ms" that spends no attempt, up to its cap."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from evsched.core import bounds, failures, tallies
from evsched.core.events import AttemptSnoozed, JobEvent, Position
from evsched.core.fold import fold
from evsched.core.invariants import Replay, check_history
from evsched.core.snooze import SNOOZE_LIMIT_ERROR
from evsched.core.state import FoldedEvent, JobState, Status, TimelineEntry, Verdict
from tests.unit.core import test_fold
from tests.unit.core.test_fold import T0, _meta, cancel, enqueue, lease, requeue, start, succeed


def _snooze(token: int, delay_ms: int = 5_000, cap: int = 25, reason: str = "") -> AttemptSnoozed:
    return AttemptSnoozed(
        **_meta(source="worker-w1"), token=token, delay_ms=delay_ms, max_snoozes=cap, reason=reason
    )


@dataclass
class Job(test_fold.Job):
    """test_fold's job, enqueued, keeping its history for the invariant checker."""

    history: list[tuple[JobEvent, Position]] = field(default_factory=list)
    max_attempts: int = 3

    def __post_init__(self) -> None:
        self.run(enqueue(max_attempts=self.max_attempts))

    def apply(self, event: JobEvent, *, at: int | None = None) -> TimelineEntry:
        at = self.now if at is None else at
        self.history.append((event, Position(partition=3, offset=self.offset, log_at=at)))
        return super().apply(event, at=at)

    def ok(self, event: JobEvent, at: int | None = None) -> TimelineEntry:
        entry = self.apply(event, at=at)
        assert entry.verdict is Verdict.APPLIED, entry
        return entry

    def attempt(self, at: int | None = None) -> int:
        """Lease and start the next attempt; its token."""
        token, attempt = self.current.token + 1, self.current.attempt + 1
        self.ok(lease(token, attempt), at=at)
        self.ok(start(token))
        return token


def test_a_snooze_puts_the_job_back_without_spending_its_attempt() -> None:
    job = Job()
    token = job.attempt()
    entry = job.ok(_snooze(token, delay_ms=7_000, reason="upstream said 429"))
    state = job.current
    assert (state.status, state.attempt, state.run_at) == (Status.SCHEDULED, 0, T0 + 7_000)
    assert (state.snoozes, state.snoozed_until, state.lease_until) == (1, T0 + 7_000, None)
    assert entry.status_after is Status.SCHEDULED
    assert entry.reason == (
        "snoozed by worker-w1 for 7000 ms (snooze 1 of at most 25), attempt 1 not counted: "
        "upstream said 429"
    )


def test_a_lease_before_the_snooze_ends_is_refused_and_the_job_runs_as_attempt_one() -> None:
    job = Job()
    job.ok(_snooze(job.attempt(), delay_ms=7_000))
    early = job.apply(lease(2, 1), at=T0 + 6_999)
    assert early.verdict is Verdict.REJECTED
    job.ok(_snooze(job.attempt(T0 + 7_000), delay_ms=1_000))
    token = job.attempt(T0 + 8_000)
    assert job.current.snoozed_until is None  # the lease ended the snooze
    job.ok(succeed(token))
    state = job.current
    assert (state.status, state.attempt, state.token, state.snoozes) == (
        Status.SUCCEEDED, 1, 3, 2,
    )  # fmt: skip
    assert check_history(job.history) == []


def test_a_snooze_past_the_cap_is_a_failed_attempt_of_its_own_category() -> None:
    job = Job(max_attempts=2)
    job.ok(_snooze(job.attempt(), cap=1))
    token = job.attempt(T0 + 5_000)
    entry = job.ok(_snooze(token, cap=1, reason="still busy"))
    state = job.current
    assert (state.status, state.attempt, state.snoozes, state.snoozed_until) == (
        Status.SCHEDULED, 1, 1, None,
    )  # fmt: skip
    assert state.last_error is not None
    assert state.last_error.error_type == SNOOZE_LIMIT_ERROR
    assert state.last_error.category == failures.SNOOZE_LIMIT
    assert state.last_error.message == "snoozed 1 times already, the task allows 1: still busy"
    assert "failed (evsched.SnoozeLimit), retry in" in entry.reason
    # The cap holds for the job: the next attempt's snooze fails too, and it is dead.
    token = job.attempt(state.run_at)
    job.ok(_snooze(token, cap=1))
    assert job.current.status is Status.DEAD
    assert check_history(job.history) == []


def test_a_cap_of_zero_makes_every_snooze_a_failure() -> None:
    job = Job(max_attempts=1)
    job.ok(_snooze(job.attempt(), cap=0))
    assert job.current.status is Status.DEAD
    assert job.current.snoozes == 0


def test_a_stale_snooze_is_recorded_stale_and_changes_nothing() -> None:
    job = Job()
    job.ok(_snooze(job.attempt()))
    job.attempt(T0 + 5_000)
    before = job.current
    entry = job.apply(_snooze(1))
    assert entry.verdict is Verdict.STALE
    assert "token 1 is stale, current is 2" in entry.reason
    assert job.current == before


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (_snooze(1, delay_ms=-1), "delay_ms -1 is outside"),
        (_snooze(1, delay_ms=bounds.MAX_SNOOZE_MS + 1), "delay_ms 2592000001 is outside"),
        (_snooze(1, cap=-1), "max_snoozes -1 is outside"),
        (_snooze(1, cap=bounds.MAX_SNOOZES + 1), "max_snoozes 10001 is outside"),
        (_snooze(1, reason="x" * 1025), "reason has 1025 UTF-8 bytes, above the limit of 1024"),
        (_snooze(-1), "token -1 is outside"),
    ],
)
def test_a_foreign_snooze_out_of_bounds_is_refused_with_its_field(
    event: AttemptSnoozed, why: str
) -> None:
    job = Job()
    job.attempt()
    before = job.current
    entry = job.apply(event)
    assert entry.verdict is Verdict.REJECTED
    assert why in entry.reason
    assert job.current == before


def test_snoozes_of_unknown_ended_or_unstarted_jobs_are_refused() -> None:
    unknown, _ = fold(None, _snooze(1), Position(partition=0, offset=0, log_at=T0))
    assert unknown is None
    job = Job()
    job.ok(lease(1, 1))
    assert job.apply(_snooze(1)).reason.endswith("attempt not started")
    job.ok(cancel())
    entry = job.apply(_snooze(1))
    assert (entry.verdict, job.current.status) == (Verdict.REJECTED, Status.CANCELLED)
    assert entry.reason.endswith("job is already cancelled")


def test_a_cancel_ends_a_snooze_and_a_requeue_resets_the_count() -> None:
    job = Job()
    job.ok(_snooze(job.attempt()))
    job.ok(cancel())
    assert (job.current.snoozes, job.current.snoozed_until) == (1, None)
    job.ok(requeue())
    assert (job.current.status, job.current.snoozes) == (Status.SCHEDULED, 0)


def test_a_snooze_within_the_cap_is_no_retry_but_one_past_it_is() -> None:
    running = replace(Job().current, status=Status.RUNNING)
    entry = TimelineEntry(
        partition=0, offset=1, log_at=T0, kind="AttemptSnoozed", event_id="e", source="s",
        verdict=Verdict.APPLIED, reason="r",
    )  # fmt: skip
    back = replace(running, status=Status.SCHEDULED, snoozed_until=T0 + 1)
    assert tallies.tallied(FoldedEvent(entry, running, back)) == ()
    failed = replace(running, status=Status.SCHEDULED)
    assert tallies.tallied(FoldedEvent(entry, running, failed)) == (tallies.RETRIES,)


def _forgets_the_delay(state: JobState | None, event: JobEvent, position: Position) -> Any:
    """Bug: a snooze puts the job back due at once."""
    new, entry = fold(state, event, position)
    if new is not None and isinstance(event, AttemptSnoozed):
        new = replace(new, run_at=position.log_at)
    return new, entry


def test_the_invariants_hold_a_snoozed_job_to_its_delay_independently_of_the_fold() -> None:
    job = Job()
    job.ok(_snooze(job.attempt(), delay_ms=9_000))
    job.history.append(
        (lease(2, 1), Position(
            partition=3, offset=job.offset, log_at=T0 + 10
        ))
    )  # fmt: skip
    assert check_history(job.history) == []  # the real fold refuses the early lease
    found = Replay(fold_job=_forgets_the_delay).feed_all(job.history).violations
    assert [v.invariant for v in found] == ["I6"]
