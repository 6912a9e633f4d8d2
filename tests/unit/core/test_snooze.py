"""Snoozes (core.snooze): a handler's "again in N ms" that spends no attempt, up to its cap."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from evsched.core import bounds, failures, tallies
from evsched.core.events import (
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobRequeued,
    Position,
)
from evsched.core.fold import fold
from evsched.core.invariants import Replay, check_history
from evsched.core.snooze import SNOOZE_LIMIT_ERROR
from evsched.core.state import FoldedEvent, JobState, Status, TimelineEntry, Verdict

T0 = 1_000_000
_ids = itertools.count()


def _meta() -> dict[str, Any]:
    return {"event_id": f"e{next(_ids)}", "job_id": "j", "emitted_at": 0, "source": "worker-w1"}


def _snooze(token: int, delay_ms: int = 5_000, cap: int = 25, reason: str = "") -> AttemptSnoozed:
    return AttemptSnoozed(**_meta(), token=token, delay_ms=delay_ms, max_snoozes=cap, reason=reason)


class Job:
    """One job folded event by event, at a log time that only moves when told."""

    def __init__(self, max_attempts: int = 3) -> None:
        self.now = T0
        self.offset = 0
        self.state: JobState | None = None
        self.history: list[tuple[JobEvent, Position]] = []
        self.apply(
            JobEnqueued(**_meta(), task="t", queue="q", args=b"{}", max_attempts=max_attempts)
        )

    def fold(self, event: JobEvent, at: int | None = None) -> TimelineEntry:
        self.now = self.now if at is None else at
        position = Position(partition=0, offset=self.offset, log_at=self.now)
        self.offset += 1
        self.history.append((event, position))
        self.state, entry = fold(self.state, event, position)
        return entry

    def apply(self, event: JobEvent, at: int | None = None) -> TimelineEntry:
        entry = self.fold(event, at)
        assert entry.verdict is Verdict.APPLIED, entry
        return entry

    def run(self, at: int | None = None) -> int:
        """Lease and start the next attempt; its token."""
        assert self.state is not None
        token, attempt = self.state.token + 1, self.state.attempt + 1
        self.apply(JobLeased(**_meta(), token=token, attempt=attempt, lease_ms=30_000), at)
        self.apply(AttemptStarted(**_meta(), token=token, worker_id="w1", lease_ms=30_000))
        return token

    @property
    def now_state(self) -> JobState:
        assert self.state is not None
        return self.state


def test_a_snooze_puts_the_job_back_without_spending_its_attempt() -> None:
    job = Job()
    token = job.run()
    entry = job.apply(_snooze(token, delay_ms=7_000, reason="upstream said 429"))
    state = job.now_state
    assert (state.status, state.attempt, state.run_at) == (Status.SCHEDULED, 0, T0 + 7_000)
    assert (state.snoozes, state.snoozed_until, state.lease_until) == (1, T0 + 7_000, None)
    assert entry.status_after is Status.SCHEDULED
    assert entry.reason == (
        "snoozed by worker-w1 for 7000 ms (snooze 1 of at most 25), attempt 1 not counted: "
        "upstream said 429"
    )


def test_a_lease_before_the_snooze_ends_is_refused_and_the_job_runs_as_attempt_one() -> None:
    job = Job()
    job.apply(_snooze(job.run(), delay_ms=7_000))
    early = job.fold(JobLeased(**_meta(), token=2, attempt=1, lease_ms=30_000), T0 + 6_999)
    assert early.verdict is Verdict.REJECTED
    job.apply(_snooze(job.run(T0 + 7_000), delay_ms=1_000))
    token = job.run(T0 + 8_000)
    assert job.now_state.snoozed_until is None  # the lease ended the snooze
    job.apply(AttemptSucceeded(**_meta(), token=token, result=b"1"))
    state = job.now_state
    assert (state.status, state.attempt, state.token, state.snoozes) == (
        Status.SUCCEEDED, 1, 3, 2,
    )  # fmt: skip
    assert check_history(job.history) == []


def test_a_snooze_past_the_cap_is_a_failed_attempt_of_its_own_category() -> None:
    job = Job(max_attempts=2)
    job.apply(_snooze(job.run(), cap=1))
    token = job.run(T0 + 5_000)
    entry = job.apply(_snooze(token, cap=1, reason="still busy"))
    state = job.now_state
    assert (state.status, state.attempt, state.snoozes, state.snoozed_until) == (
        Status.SCHEDULED, 1, 1, None,
    )  # fmt: skip
    assert state.last_error is not None
    assert state.last_error.error_type == SNOOZE_LIMIT_ERROR
    assert state.last_error.category == failures.SNOOZE_LIMIT
    assert state.last_error.message == "snoozed 1 times already, the task allows 1: still busy"
    assert "failed (evsched.SnoozeLimit), retry in" in entry.reason
    # The cap holds for the job: the next attempt's snooze fails too, and it is dead.
    token = job.run(state.run_at)
    job.apply(_snooze(token, cap=1))
    assert job.now_state.status is Status.DEAD
    assert check_history(job.history) == []


def test_a_cap_of_zero_makes_every_snooze_a_failure() -> None:
    job = Job(max_attempts=1)
    job.apply(_snooze(job.run(), cap=0))
    assert job.now_state.status is Status.DEAD
    assert job.now_state.snoozes == 0


def test_a_stale_snooze_is_recorded_stale_and_changes_nothing() -> None:
    job = Job()
    job.apply(_snooze(job.run()))
    job.run(T0 + 5_000)
    before = job.now_state
    entry = job.fold(_snooze(1))
    assert entry.verdict is Verdict.STALE
    assert "token 1 is stale, current is 2" in entry.reason
    assert job.now_state == before


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
    job.run()
    before = job.now_state
    entry = job.fold(event)
    assert entry.verdict is Verdict.REJECTED
    assert why in entry.reason
    assert job.now_state == before


def test_snoozes_of_unknown_ended_or_unstarted_jobs_are_refused() -> None:
    unknown, _ = fold(None, _snooze(1), Position(partition=0, offset=0, log_at=T0))
    assert unknown is None
    job = Job()
    job.apply(JobLeased(**_meta(), token=1, attempt=1, lease_ms=30_000))
    assert job.fold(_snooze(1)).reason.endswith("attempt not started")
    job.apply(JobCancelled(**_meta()))
    entry = job.fold(_snooze(1))
    assert (entry.verdict, job.now_state.status) == (Verdict.REJECTED, Status.CANCELLED)
    assert entry.reason.endswith("job is already cancelled")


def test_a_cancel_ends_a_snooze_and_a_requeue_resets_the_count() -> None:
    job = Job()
    job.apply(_snooze(job.run()))
    job.apply(JobCancelled(**_meta()))
    assert (job.now_state.snoozes, job.now_state.snoozed_until) == (1, None)
    job.apply(JobRequeued(**_meta()))
    assert (job.now_state.status, job.now_state.snoozes) == (Status.SCHEDULED, 0)


def test_a_snooze_within_the_cap_is_no_retry_but_one_past_it_is() -> None:
    running = replace(Job().now_state, status=Status.RUNNING)
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
    job.apply(_snooze(job.run(), delay_ms=9_000))
    job.history.append(
        (JobLeased(**_meta(), token=2, attempt=1, lease_ms=30_000), Position(
            partition=0, offset=job.offset, log_at=T0 + 10
        ))
    )  # fmt: skip
    assert check_history(job.history) == []  # the real fold refuses the early lease
    found = Replay(fold_job=_forgets_the_delay).feed_all(job.history).violations
    assert [v.invariant for v in found] == ["I6"]
