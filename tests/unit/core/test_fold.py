"""Focused tests of the job fold: retries, fencing, lease timing, idempotent enqueue, requeue."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from evsched.core import bounds, ids, retry
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobRequeued,
    LeaseExpired,
    LeaseRenewed,
    Position,
    RetryPolicy,
)
from evsched.core.fold import RECENT_EVENT_IDS, _applied, fold
from evsched.core.state import JobState, Status, TimelineEntry, Verdict
from tests.strategies import job_states

T0 = 1_700_000_000_000
LEASE_MS = 30_000
_seq = itertools.count()


def _meta(**over: Any) -> dict[str, Any]:
    return {"event_id": f"e{next(_seq)}", "job_id": "j", "emitted_at": 0, "source": "t"} | over


def enqueue(**over: Any) -> JobEnqueued:
    fields = {"task": "send", "queue": "mail", "args": b'{"to": 1}'} | over
    return JobEnqueued(**_meta(**fields))


def lease(
    token: int, attempt: int, lease_ms: int = LEASE_MS, not_before: int | None = None
) -> JobLeased:
    return JobLeased(
        **_meta(), token=token, attempt=attempt, lease_ms=lease_ms, not_before=not_before
    )


def start(token: int, lease_ms: int = LEASE_MS) -> AttemptStarted:
    return AttemptStarted(**_meta(), token=token, worker_id="w1", lease_ms=lease_ms)


def renew(token: int, lease_ms: int = LEASE_MS) -> LeaseRenewed:
    return LeaseRenewed(**_meta(), token=token, lease_ms=lease_ms)


def checkpoint(token: int, data: bytes) -> AttemptCheckpointed:
    return AttemptCheckpointed(**_meta(), token=token, checkpoint=data)


def succeed(token: int) -> AttemptSucceeded:
    return AttemptSucceeded(**_meta(), token=token, result=b"done")


def fail(token: int, *, retryable: bool = True) -> AttemptFailed:
    return AttemptFailed(**_meta(), token=token, error_type="E", message="m", retryable=retryable)


def expire(token: int) -> LeaseExpired:
    return LeaseExpired(**_meta(), token=token)


def cancel() -> JobCancelled:
    return JobCancelled(**_meta(), reason="user asked")


def requeue(run_at: int | None = None) -> JobRequeued:
    return JobRequeued(**_meta(), run_at=run_at)


@dataclass
class Job:
    """One job's state, folded event by event at a log time the test controls."""

    state: JobState | None = None
    now: int = T0
    offset: int = 0
    entries: list[TimelineEntry] = field(default_factory=list)

    def apply(self, event: JobEvent, *, at: int | None = None) -> TimelineEntry:
        self.now = self.now if at is None else at
        before = self.state
        self.state, entry = fold(
            before, event, Position(partition=3, offset=self.offset, log_at=self.now)
        )
        self.offset += 1
        if entry.verdict is not Verdict.APPLIED:
            assert self.state is before
        self.entries.append(entry)
        return entry

    def run(self, *events: JobEvent) -> JobState:
        for event in events:
            entry = self.apply(event)
            assert entry.verdict is Verdict.APPLIED, entry.reason
        return self.current

    @property
    def current(self) -> JobState:
        assert self.state is not None
        return self.state


def test_enqueue_without_run_at_is_due_at_its_log_time() -> None:
    job = Job()
    state = job.run(enqueue(max_attempts=1, labels={"b": "2", "a": "1"}))
    assert (state.status, state.run_at, state.enqueued_at, state.partition) == (
        Status.SCHEDULED,
        T0,
        T0,
        3,
    )
    assert state.max_attempts == 1
    assert list(state.labels) == ["a", "b"]


def test_enqueue_with_no_attempt_allowed_is_refused_not_clamped() -> None:
    job = Job()
    entry = job.apply(enqueue(max_attempts=0))
    assert (entry.verdict, entry.reason) == (
        Verdict.REJECTED,
        "max_attempts 0 is outside [1, 2147483647]",
    )
    assert job.state is None


def test_delayed_job_cannot_be_leased_before_run_at() -> None:
    job = Job()
    job.run(enqueue(run_at=T0 + 5_000))
    early = job.apply(lease(1, 1), at=T0 + 4_999)
    assert (early.verdict, early.reason) == (
        Verdict.REJECTED,
        "lease granted before the job's run_at",
    )
    assert job.apply(lease(1, 1), at=T0 + 5_000).verdict is Verdict.APPLIED


def test_a_pre_lease_comes_before_run_at_and_its_start_window_opens_at_run_at() -> None:
    job = Job()
    job.run(enqueue(run_at=T0 + 5_000))
    entry = job.apply(lease(1, 1, not_before=T0 + 5_000), at=T0 + 4_000)
    assert (entry.verdict, entry.reason) == (
        Verdict.APPLIED,
        "leased to token 1 for attempt 1, pre-leased 1000 ms ahead",
    )
    assert job.current.lease_until == T0 + 5_000 + LEASE_MS  # counted from run_at
    early = job.apply(start(1), at=T0 + 4_999)
    assert (early.verdict, early.reason) == (
        Verdict.REJECTED,
        "token 1 started before the job's run_at",
    )
    assert job.current.status is Status.LEASED  # the worker starts again at run_at
    assert job.apply(start(1), at=T0 + 5_000).verdict is Verdict.APPLIED


def test_a_pre_lease_for_another_run_at_or_too_far_ahead_is_rejected() -> None:
    job = Job()
    job.run(enqueue(run_at=T0 + 100_000))
    other = job.apply(lease(1, 1, not_before=T0 + 99_000), at=T0 + 99_000)
    assert (other.verdict, other.reason) == (
        Verdict.REJECTED,
        f"pre-lease for run_at {T0 + 99_000}, but the job's run_at is {T0 + 100_000}",
    )
    far = job.apply(lease(1, 1, not_before=T0 + 100_000), at=T0 + 39_999)
    assert (far.verdict, far.reason) == (
        Verdict.REJECTED,
        "pre-lease more than 60000 ms ahead of the job's run_at",
    )
    assert job.apply(lease(1, 1, not_before=T0 + 100_000), at=T0 + 40_000).verdict is (
        Verdict.APPLIED
    )


def test_a_pre_lease_logged_after_run_at_is_an_ordinary_lease() -> None:
    job = Job()
    job.run(enqueue(run_at=T0 + 5_000))
    entry = job.apply(lease(1, 1, not_before=T0 + 5_000), at=T0 + 6_000)
    assert (entry.verdict, entry.reason) == (Verdict.APPLIED, "leased to token 1 for attempt 1")
    assert job.current.lease_until == T0 + 6_000 + LEASE_MS


def test_an_unstarted_pre_lease_expires_at_run_at_plus_its_lease_and_costs_no_attempt() -> None:
    job = Job()
    job.run(enqueue(run_at=T0 + 5_000))
    job.apply(lease(1, 1, not_before=T0 + 5_000), at=T0 + 4_000)
    assert job.apply(expire(1), at=T0 + 5_000 + LEASE_MS - 1).verdict is Verdict.REJECTED
    assert job.apply(expire(1), at=T0 + 5_000 + LEASE_MS).verdict is Verdict.APPLIED
    assert (job.current.status, job.current.attempt) == (Status.SCHEDULED, 0)


def test_a_cancelled_pre_lease_rejects_its_start() -> None:
    job = Job()
    job.run(enqueue(run_at=T0 + 5_000))
    job.apply(lease(1, 1, not_before=T0 + 5_000), at=T0 + 4_000)
    assert job.apply(cancel(), at=T0 + 4_500).verdict is Verdict.APPLIED
    late = job.apply(start(1), at=T0 + 5_000)
    assert late.verdict is Verdict.REJECTED and job.current.status is Status.CANCELLED


def test_a_lease_is_applied_only_at_the_next_token() -> None:
    job = Job()
    job.run(enqueue(), lease(1, 1))
    job.now += LEASE_MS
    job.run(expire(1), lease(2, 1), start(2), fail(2))  # an unstarted lease spends no attempt
    job.now = job.current.run_at
    # Older, current, or ahead of the next (what a forger sends): each rejected, naming the next.
    for token in (1, 2, 4, 9, bounds.MAX_TOKEN):
        entry = job.apply(lease(token, 2))
        assert (entry.verdict, entry.reason) == (
            Verdict.REJECTED,
            f"lease token {token}, expected token 3",
        )
    assert job.current.token == 2
    assert job.apply(lease(3, 2)).verdict is Verdict.APPLIED


def test_lease_for_the_wrong_attempt_number_is_rejected() -> None:
    job = Job()
    job.run(enqueue())
    for attempt in (2, 3):
        entry = job.apply(lease(1, attempt))
        assert (entry.verdict, entry.reason) == (
            Verdict.REJECTED,
            f"lease for attempt {attempt}, expected attempt 1",
        )


def test_lease_times_come_from_log_time_not_from_the_worker() -> None:
    job = Job()
    job.run(enqueue())
    assert job.run(lease(1, 1)).lease_until == T0 + LEASE_MS
    job.now = T0 + 100
    late_worker = AttemptStarted(
        **_meta(emitted_at=T0 + 10**9), token=1, worker_id="w", lease_ms=50
    )
    assert job.run(late_worker).lease_until == T0 + 150
    job.now = T0 + 400
    assert job.run(renew(1, lease_ms=1_000)).lease_until == T0 + 1_400


def test_lease_expired_before_lease_until_is_rejected() -> None:
    job = Job()
    job.run(enqueue(), lease(1, 1))
    entry = job.apply(expire(1), at=T0 + LEASE_MS - 1)
    assert (entry.verdict, job.current.status) == (Verdict.REJECTED, Status.LEASED)
    job.run(start(1))  # the run lease now lasts until T0 + 2 * LEASE_MS - 1
    assert job.apply(expire(1), at=T0 + LEASE_MS).verdict is Verdict.REJECTED
    assert job.apply(expire(1), at=T0 + 2 * LEASE_MS - 1).verdict is Verdict.APPLIED
    state = job.current
    assert (state.status, state.attempt, state.lease_until, state.worker_id) == (
        Status.SCHEDULED,
        1,
        None,
        None,
    )
    assert state.last_error is not None
    assert state.last_error.error_type == "LeaseExpired"


def test_retryable_failure_reschedules_after_backoff_from_log_time() -> None:
    job = Job()
    job.run(enqueue(), lease(1, 1), start(1))
    job.now = T0 + 777
    state = job.run(fail(1))
    expected = T0 + 777 + retry.backoff_ms(RetryPolicy(), "j", 1)
    assert (state.status, state.run_at) == (Status.SCHEDULED, expected)
    assert state.last_error is not None
    assert state.last_error.retryable


def test_permanent_failure_is_dead_at_once() -> None:
    job = Job()
    job.run(enqueue(max_attempts=5), lease(1, 1), start(1))
    state = job.run(fail(1, retryable=False))
    assert (state.status, state.attempt) == (Status.DEAD, 1)
    assert "permanent error" in job.entries[-1].reason


def test_attempts_exhausted_is_dead() -> None:
    job = Job()
    job.run(enqueue(max_attempts=2), lease(1, 1), start(1), fail(1))
    job.now = job.current.run_at
    job.run(lease(2, 2), start(2))
    job.now += 2 * LEASE_MS
    state = job.run(expire(2))  # a started attempt's lease expiry counts as an attempt
    assert (state.status, state.attempt) == (Status.DEAD, 2)
    assert "2 attempts used" in job.entries[-1].reason


def test_duplicate_event_id_is_a_duplicate_within_the_window() -> None:
    job = Job()
    first = enqueue()
    job.run(first, lease(1, 1))
    started = start(1)
    job.run(started)
    assert job.apply(started).verdict is Verdict.DUPLICATE
    assert job.apply(first).verdict is Verdict.DUPLICATE
    for _ in range(RECENT_EVENT_IDS + 3):
        job.run(renew(1))
    assert len(job.current.recent_event_ids) == RECENT_EVENT_IDS
    # Out of the window the transition rules still refuse the replay.
    assert job.apply(started).verdict is Verdict.REJECTED


def test_idempotent_enqueue_same_body_is_duplicate_other_body_is_conflict() -> None:
    job_id = ids.job_id_for_key("mail", "order-42")
    job = Job()
    job.run(enqueue(job_id=job_id, idempotency_key="order-42"))
    again = job.apply(enqueue(job_id=job_id, idempotency_key="order-42"))
    other = job.apply(enqueue(job_id=job_id, idempotency_key="order-42", args=b"{}"))
    assert (again.verdict, other.verdict) == (Verdict.DUPLICATE, Verdict.CONFLICT)
    assert job.current.body_digest == ids.body_digest("send", "mail", b'{"to": 1}')


def test_a_forged_body_digest_does_not_pass_for_another_body() -> None:
    """Issue 9 D.10: the fold recomputes the digest; a victim's digest on other args conflicts."""
    job = Job()
    victim = ids.body_digest("send", "mail", b'{"to": 1}')
    job.run(enqueue(body_digest=b"forged", args=b'{"to": "attacker"}'))
    assert job.current.body_digest == ids.body_digest("send", "mail", b'{"to": "attacker"}')
    assert job.apply(enqueue(body_digest=victim)).verdict is Verdict.CONFLICT
    same = job.apply(enqueue(body_digest=b"other", args=b'{"to": "attacker"}'))
    assert same.verdict is Verdict.DUPLICATE


def test_requeue_resets_attempts_but_never_the_token() -> None:
    job = Job()
    job.run(enqueue(max_attempts=1), lease(1, 1))
    job.now += LEASE_MS
    job.run(expire(1), lease(2, 1), start(2), fail(2))
    assert job.current.status is Status.DEAD
    job.now = T0 + 60_000
    state = job.run(requeue(run_at=T0 + 90_000))
    assert (state.status, state.attempt, state.token, state.run_at) == (
        Status.SCHEDULED,
        0,
        2,
        T0 + 90_000,
    )
    job.now = T0 + 90_000
    assert job.apply(lease(1, 1)).verdict is Verdict.REJECTED
    assert job.apply(lease(2, 1)).verdict is Verdict.REJECTED
    assert job.run(lease(3, 1)).attempt == 1


def test_requeue_of_a_cancelled_job_is_due_at_its_log_time() -> None:
    job = Job()
    job.run(enqueue(run_at=T0 + 10**6), cancel())
    job.now = T0 + 5
    assert job.run(requeue()).run_at == T0 + 5


def test_cancel_then_late_completion_is_rejected() -> None:
    job = Job()
    job.run(enqueue(), lease(1, 1), start(1))
    state = job.run(cancel())
    assert (state.status, state.lease_until) == (Status.CANCELLED, None)
    assert "user asked" in job.entries[-1].reason
    late = job.apply(succeed(1))
    assert (late.verdict, late.status_after) == (Verdict.REJECTED, Status.CANCELLED)
    assert job.current.result is None


def test_zombie_completion_after_lease_expiry_is_stale() -> None:
    job = Job()
    job.run(enqueue(), lease(1, 1), start(1))
    job.now += LEASE_MS
    job.run(expire(1))
    job.now = job.current.run_at
    job.run(lease(2, 2), start(2))
    zombie = job.apply(succeed(1))
    assert (zombie.verdict, zombie.token) == (Verdict.STALE, 1)
    assert "current is 2" in zombie.reason
    assert job.current.status is Status.RUNNING
    assert job.run(succeed(2)).result == b"done"


def test_checkpoint_is_kept_across_retries() -> None:
    job = Job()
    job.run(enqueue(), lease(1, 1), start(1), checkpoint(1, b"page=3"), fail(1))
    assert job.current.checkpoint == b"page=3"
    job.now = job.current.run_at
    state = job.run(lease(2, 2), start(2))
    assert state.checkpoint == b"page=3"
    assert job.run(checkpoint(2, b"page=7")).checkpoint == b"page=7"


def test_timeline_entry_records_position_kind_token_and_status() -> None:
    job = Job()
    job.run(enqueue(), lease(1, 1))
    job.now += LEASE_MS
    job.run(expire(1), lease(2, 1))
    entry = job.entries[-1]
    assert (entry.partition, entry.offset, entry.log_at, entry.kind, entry.token) == (
        3,
        3,
        T0 + LEASE_MS,
        "JobLeased",
        2,
    )
    assert (entry.source, entry.status_after) == ("t", Status.LEASED)
    assert job.entries[0].token is None


def test_a_repeat_older_than_the_window_falls_to_the_transition_rules() -> None:
    # Known limit of the id window: a late repeat whose transition is still allowed applies again.
    job = Job()
    job.run(enqueue(), lease(1, 1), start(1))
    old = checkpoint(1, b"page=1")
    job.run(old, *(renew(1) for _ in range(RECENT_EVENT_IDS)), checkpoint(1, b"page=2"))
    assert job.apply(old).verdict is Verdict.APPLIED
    assert job.current.checkpoint == b"page=1"


@settings(max_examples=100, deadline=None)
@given(state=job_states(), token=st.integers(0, 10**6), log_at=st.integers(0, 2**62))
def test_the_fast_copy_of_an_applied_step_equals_dataclasses_replace(
    state: JobState, token: int, log_at: int
) -> None:
    assert not hasattr(JobState, "__post_init__")  # _applied bypasses __init__
    event = renew(token)
    new = _applied(state, event, Position(partition=0, offset=0, log_at=log_at), token=token)
    recent = (*state.recent_event_ids, event.event_id)[-RECENT_EVENT_IDS:]
    assert new == replace(state, token=token, recent_event_ids=recent, updated_at=log_at)
    assert all(hasattr(new, f.name) for f in fields(JobState))
    assert new is not state


def test_an_unstarted_lease_expiry_costs_no_attempt_and_no_backoff() -> None:
    """Issue 9 C.7: a lease no worker started goes back to scheduled, due at once, uncounted."""
    job = Job()
    job.run(enqueue(max_attempts=1), lease(1, 1))
    job.now = T0 + LEASE_MS
    state = job.run(expire(1))
    assert (state.status, state.attempt, state.run_at, state.token) == (
        Status.SCHEDULED,
        0,
        T0 + LEASE_MS,
        1,
    )
    assert (state.lease_until, state.last_error) == (None, None)
    reason = "lease of token 1 expired before any start: attempt not counted"
    assert job.entries[-1].reason == reason
    # The next lease is attempt 1 again, with a new token; a started one's expiry still counts.
    state = job.run(lease(2, 1), start(2))
    job.now += 2 * LEASE_MS
    assert (job.run(expire(2)).status, job.current.attempt) == (Status.DEAD, 1)


def test_a_start_appended_at_or_after_its_start_deadline_is_refused() -> None:
    """Issue 9 C.7: a worker held past the deadline between its check and its start's append
    has not started: the lease is gone by the log's clock, and its expiry costs nothing."""
    job = Job()
    job.run(enqueue(max_attempts=1), lease(1, 1))
    assert job.apply(start(1), at=T0 + LEASE_MS - 1).verdict is Verdict.APPLIED
    late = Job()
    late.run(enqueue(max_attempts=1), lease(1, 1))
    entry = late.apply(start(1), at=T0 + LEASE_MS)
    assert (entry.verdict, late.current.status) == (Verdict.REJECTED, Status.LEASED)
    assert entry.reason == f"token 1 started after its start deadline {T0 + LEASE_MS}"
    state = late.run(expire(1))
    assert (state.status, state.attempt) == (Status.SCHEDULED, 0)
