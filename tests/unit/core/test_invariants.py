"""The invariant checkers: silent on good histories, and they catch deliberately broken folds."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Event,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobRequeued,
    JobTemplate,
    LeaseExpired,
    LeaseRenewed,
    Position,
    ScheduleDeleted,
    ScheduleFired,
    ScheduleUpserted,
)
from evsched.core.fold import fold
from evsched.core.invariants import Replay, Violation, check_history, replay
from evsched.core.state import JobState, Status, TimelineEntry, Verdict

T0 = 1_735_689_600_000  # 2025-01-01T00:00Z
LEASE = 10_000
_seq = itertools.count()


def _meta(job: str) -> dict[str, Any]:
    return {"event_id": f"e{next(_seq)}", "job_id": job, "emitted_at": 0, "source": "t"}


def enqueue(job: str, run_at: int | None = None, max_attempts: int = 3) -> JobEnqueued:
    return JobEnqueued(
        **_meta(job), task="t", queue="q", args=b"{}", run_at=run_at, max_attempts=max_attempts
    )


def lease(job: str, token: int, attempt: int) -> JobLeased:
    return JobLeased(**_meta(job), token=token, attempt=attempt, lease_ms=LEASE)


def start(job: str, token: int) -> AttemptStarted:
    return AttemptStarted(**_meta(job), token=token, worker_id="w", lease_ms=LEASE)


def succeed(job: str, token: int) -> AttemptSucceeded:
    return AttemptSucceeded(**_meta(job), token=token, result=b"r")


def fail(job: str, token: int, retryable: bool = True) -> AttemptFailed:
    return AttemptFailed(
        **_meta(job), token=token, error_type="E", message="m", retryable=retryable
    )


@dataclass
class Log:
    """A history under construction: offsets count per partition, time only moves when told."""

    now: int = T0
    items: list[tuple[Event, Position]] = field(default_factory=list)
    offsets: dict[int, int] = field(default_factory=dict)

    def add(self, *events: Event, partition: int = 0, at: int | None = None) -> Log:
        self.now = self.now if at is None else at
        for event in events:
            offset = self.offsets.get(partition, 0)
            self.offsets[partition] = offset + 1
            self.items.append(
                (event, Position(partition=partition, offset=offset, log_at=self.now))
            )
        return self


def good_history() -> Log:
    log = Log()
    log.add(enqueue("a"), lease("a", 1, 1), start("a", 1), partition=0)
    log.add(enqueue("b", run_at=T0 + 5_000), partition=1)
    log.add(
        AttemptCheckpointed(**_meta("a"), token=1, checkpoint=b"c"),
        LeaseRenewed(**_meta("a"), token=1, lease_ms=LEASE),
        fail("a", 1),
        partition=0,
    )
    log.add(
        lease("b", 1, 1),
        start("b", 1),
        succeed("b", 1),
        succeed("b", 1),
        partition=1,
        at=T0 + 5_000,
    )
    log.add(lease("a", 2, 2), start("a", 2), at=T0 + 60_000)
    log.add(LeaseExpired(**_meta("a"), token=2), at=T0 + 60_000 + LEASE)
    log.add(JobCancelled(**_meta("a")), JobRequeued(**_meta("a"), run_at=T0 + 90_000))
    log.add(lease("a", 3, 1), start("a", 3), succeed("a", 3), at=T0 + 90_000)
    log.add(succeed("ghost", 1), partition=2)
    # Schedule events share the log (and here even an id with a job) but not the job's account.
    schedule = {"schedule_id": "a", "emitted_at": 0, "source": "t"}
    template = JobTemplate(task="t", queue="q", args=b"{}")
    log.add(ScheduleDeleted(**schedule, event_id="s0"))
    upsert = ScheduleUpserted(
        **schedule, event_id="s1", cron="* * * * *", timezone="UTC", template=template
    )
    log.add(upsert, at=T0 + 100_000)
    log.add(
        ScheduleFired(**schedule, event_id="s2", fire_at=T0 + 120_000, job_id="x"), at=T0 + 130_000
    )
    return log


def test_a_good_history_has_no_violations_and_folds_per_entity() -> None:
    result = replay(good_history().items)
    assert result.violations == []
    assert {job: state.status for job, state in result.jobs.items()} == {
        "a": Status.SUCCEEDED,
        "b": Status.SUCCEEDED,
    }
    assert [e.verdict for e in result.job_timelines["b"]][-2:] == [
        Verdict.APPLIED,
        Verdict.REJECTED,
    ]
    assert [e.verdict for e in result.job_timelines["ghost"]] == [Verdict.REJECTED]
    # A schedule may share its id with a job: they are different entities.
    assert result.schedules["a"].last_fire_at == T0 + 120_000
    assert [(e.kind, e.verdict) for e in result.schedule_timelines["a"]] == [
        ("ScheduleDeleted", Verdict.REJECTED),
        ("ScheduleUpserted", Verdict.APPLIED),
        ("ScheduleFired", Verdict.APPLIED),
    ]
    assert [e.verdict for e in result.job_timelines["a"]] == [Verdict.APPLIED] * 14


def test_replay_can_be_fed_incrementally() -> None:
    items = good_history().items
    streamed = Replay()
    entries = [streamed.feed(event, position) for event, position in items]
    assert [e.offset for e in entries] == [p.offset for _, p in items]
    assert streamed.jobs == replay(items).jobs
    assert check_history(items) == []


# --- deliberately broken folds: the checker must notice each bug ------------------------------


def _trusting_clock(state: JobState | None, event: JobEvent, position: Position) -> Any:
    """Bug: leases and starts use the job's run_at instead of the log time when it is later."""
    if state is not None and isinstance(event, JobLeased):
        position = replace(position, log_at=max(position.log_at, state.run_at))
    return fold(state, event, position)


def _forgets_backoff(state: JobState | None, event: JobEvent, position: Position) -> Any:
    """Bug: a retry keeps the old run_at, so the next lease is not held back by the backoff."""
    new, entry = fold(state, event, position)
    if state is not None and new is not None and isinstance(event, AttemptFailed):
        new = replace(new, run_at=state.run_at)
    return new, entry


def _forgets_requeue_run_at(state: JobState | None, event: JobEvent, position: Position) -> Any:
    new, entry = fold(state, event, position)
    if state is not None and new is not None and isinstance(event, JobRequeued):
        new = replace(new, run_at=state.run_at)
    return new, entry


def _reuses_tokens(state: JobState | None, event: JobEvent, position: Position) -> Any:
    """Bug: the token comparison is missing."""
    if state is not None and isinstance(event, JobLeased):
        state = replace(state, token=min(state.token, event.token - 1))
    return fold(state, event, position)


def _succeeds_twice(state: JobState | None, event: JobEvent, position: Position) -> Any:
    """Bug: a succeeded job still accepts a completion carrying its token."""
    if state is not None and state.status is Status.SUCCEEDED:
        state = replace(state, status=Status.RUNNING)
    return fold(state, event, position)


def _leases_unknown_jobs(state: JobState | None, event: JobEvent, position: Position) -> Any:
    """Bug: a lease for an unknown job conjures the job out of thin air."""
    if state is None and isinstance(event, JobLeased):
        new, _ = fold(None, enqueue(event.job_id), position)
        return fold(new, event, position)
    return fold(state, event, position)


def _starts_early(state: JobState | None, event: JobEvent, position: Position) -> Any:
    """Bug: a start is judged at its lease's log time, so an early one passes."""
    if state is not None and isinstance(event, AttemptStarted):
        return fold(state, event, replace(position, log_at=max(position.log_at, state.run_at)))
    return fold(state, event, position)


def _only(violations: list[Violation]) -> Violation:
    assert len(violations) == 1, violations
    return violations[0]


def test_i6_catches_a_fold_that_leases_before_run_at() -> None:
    log = Log().add(enqueue("j", run_at=T0 + 1_000), partition=4).add(lease("j", 1, 1), partition=4)
    assert check_history(log.items) == []
    found = _only(check_history(log.items, fold_job=_trusting_clock))
    assert (found.invariant, found.job_id, found.partition, found.offset) == ("I6", "j", 4, 1)
    assert found.detail.startswith("JobLeased ")
    assert f"log time {T0} is before run_at {T0 + 1_000}" in found.detail


def test_i6_tracks_run_at_through_retries_independently_of_the_fold() -> None:
    log = Log().add(enqueue("j"), lease("j", 1, 1), start("j", 1), fail("j", 1))
    log.add(lease("j", 2, 2), at=T0 + 1)  # well inside the backoff
    assert check_history(log.items) == []
    violations = check_history(log.items, fold_job=_forgets_backoff)
    assert [(v.invariant, v.offset) for v in violations] == [("I6", 4)]


def test_i6_tracks_run_at_through_lease_expiry() -> None:
    log = Log().add(enqueue("j"), lease("j", 1, 1), start("j", 1))
    log.add(LeaseExpired(**_meta("j"), token=1), at=T0 + 2 * LEASE)
    log.add(lease("j", 2, 2), at=T0 + 2 * LEASE)
    log.add(lease("j", 2, 2), at=T0 + 2 * LEASE + 3_000)  # the same lease once it is due
    result = replay(log.items)
    assert result.violations == []
    assert result.job_timelines["j"][-2].verdict is Verdict.REJECTED  # before the backoff ended
    assert result.job_timelines["j"][-1].verdict is Verdict.APPLIED


def test_i6_an_unstarted_lease_expiry_makes_the_job_due_at_once() -> None:
    log = Log().add(enqueue("j"), lease("j", 1, 1))
    log.add(LeaseExpired(**_meta("j"), token=1), at=T0 + LEASE)
    log.add(lease("j", 2, 1), at=T0 + LEASE)
    result = replay(log.items)
    assert result.violations == []
    assert result.job_timelines["j"][-1].verdict is Verdict.APPLIED


def test_i6_tracks_run_at_through_requeue() -> None:
    log = Log().add(
        enqueue("j"), JobCancelled(**_meta("j")), JobRequeued(**_meta("j"), run_at=T0 + 50)
    )
    log.add(lease("j", 1, 1))
    assert check_history(log.items) == []
    assert _only(check_history(log.items, fold_job=_forgets_requeue_run_at)).invariant == "I6"


def test_i6_catches_a_start_logged_before_run_at() -> None:
    # The fold refuses such a start (fold version 3); a fold that lets it through is caught.
    log = Log().add(enqueue("j", run_at=T0 + 100)).add(lease("j", 1, 1), at=T0 + 100)
    log.add(start("j", 1), at=T0 + 99)
    assert check_history(log.items) == []
    found = _only(check_history(log.items, fold_job=_starts_early))
    assert (found.invariant, found.offset) == ("I6", 2)
    assert found.detail.startswith("AttemptStarted ")


def test_a_pre_lease_before_run_at_is_no_violation_but_its_early_start_would_be() -> None:
    pre = replace(lease("j", 1, 1), not_before=T0 + 1_000)
    log = Log().add(enqueue("j", run_at=T0 + 1_000)).add(pre, at=T0 + 500)
    log.add(start("j", 1), at=T0 + 999).add(start("j", 1), at=T0 + 1_000).add(succeed("j", 1))
    history = replay(log.items)
    assert history.violations == []
    assert [e.verdict for e in history.job_timelines["j"]][2:4] == [
        Verdict.REJECTED,
        Verdict.APPLIED,
    ]
    found = _only(check_history(log.items, fold_job=_starts_early))
    assert (found.invariant, found.offset) == ("I6", 2)


def test_i6_catches_an_attempt_of_a_job_never_enqueued() -> None:
    log = Log().add(lease("j", 1, 1))
    assert check_history(log.items) == []
    found = _only(check_history(log.items, fold_job=_leases_unknown_jobs))
    assert found.detail.endswith("no enqueue of the job was applied before it")


def test_i7_catches_a_fold_that_reuses_a_token() -> None:
    log = Log().add(enqueue("j"), lease("j", 1, 1), start("j", 1), fail("j", 1))
    log.add(lease("j", 1, 2), at=T0 + 10**6)
    assert check_history(log.items) == []
    found = _only(check_history(log.items, fold_job=_reuses_tokens))
    assert (found.invariant, found.offset) == ("I7", 4)
    assert "lease token 1 does not exceed previous token 1" in found.detail


def test_i1_catches_a_second_applied_success() -> None:
    log = Log().add(enqueue("j"), lease("j", 1, 1), start("j", 1), succeed("j", 1), succeed("j", 1))
    assert check_history(log.items) == []
    found = _only(check_history(log.items, fold_job=_succeeds_twice))
    assert (found.invariant, found.job_id, found.offset) == ("I1", "j", 4)
    assert "applied success number 2" in found.detail


def test_entries_of_refused_events_are_recorded_but_not_audited() -> None:
    entries: list[TimelineEntry] = replay(Log().add(start("nobody", 1)).items).job_timelines[
        "nobody"
    ]
    assert [(e.verdict, e.status_after) for e in entries] == [(Verdict.REJECTED, None)]


def test_i1_allows_one_success_per_explicit_rerun() -> None:
    rerun = JobRequeued(**_meta("j"), rerun=True)
    log = Log().add(enqueue("j"), lease("j", 1, 1), start("j", 1), succeed("j", 1))
    log.add(rerun, lease("j", 2, 1), start("j", 2), succeed("j", 2), at=T0 + 10**6)
    assert check_history(log.items) == []
    plain = JobRequeued(**_meta("k"))
    broken = Log().add(enqueue("k"), lease("k", 1, 1), start("k", 1), succeed("k", 1))
    broken.add(plain, succeed("k", 1), at=T0 + 10**6)
    found = _only(check_history(broken.items, fold_job=_succeeds_twice))
    assert found.invariant == "I1"
