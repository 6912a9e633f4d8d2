"""The one counting rule of the lifetime tallies (core.tallies), verdict by verdict."""

from __future__ import annotations

import pytest

from evsched.core import tallies
from evsched.core.events import RetryPolicy
from evsched.core.state import FoldedEvent, JobState, Status, TimelineEntry, Verdict

S = Status


def job(status: Status, generation: int = 0) -> JobState:
    return JobState(
        job_id="j", status=status, task="t", queue="q", args=b"[]", priority=0, run_at=0,
        max_attempts=3, retry=RetryPolicy(), timeout_ms=1_000, enqueued_at=0, updated_at=0,
        partition=0, generation=generation,
    )  # fmt: skip


def judged(kind: str, verdict: Verdict = Verdict.APPLIED) -> TimelineEntry:
    return TimelineEntry(
        partition=0, offset=7, log_at=1_000, kind=kind, event_id="e", source="s",
        verdict=verdict, reason="r",
    )  # fmt: skip


def counted(
    kind: str,
    before: JobState | None,
    after: JobState | None,
    verdict: Verdict = Verdict.APPLIED,
) -> tuple[str, ...]:
    return tallies.tallied(FoldedEvent(judged(kind, verdict), before, after))


@pytest.mark.parametrize(
    ("kind", "before", "after", "expected"),
    [
        # a failure with attempts left: the same run tries again
        ("AttemptFailed", job(S.RUNNING), job(S.SCHEDULED), (tallies.RETRIES,)),
        # out of attempts, or permanent
        ("AttemptFailed", job(S.RUNNING), job(S.DEAD), (tallies.DEAD_LETTERS,)),
        # a failure that ends the run while an enqueue was held (core.unique): the next run
        # starts, which is no retry, and the job never went dead
        ("AttemptFailed", job(S.RUNNING), job(S.SCHEDULED, generation=1), ()),
        ("AttemptFailed", None, job(S.SCHEDULED), ()),
        ("AttemptSucceeded", job(S.RUNNING), job(S.SUCCEEDED), (tallies.SUCCEEDED,)),
        # a success that starts a held run is still a success, and no retry
        ("AttemptSucceeded", job(S.RUNNING), job(S.SCHEDULED, generation=1), (tallies.SUCCEEDED,)),
        ("LeaseExpired", job(S.RUNNING), job(S.SCHEDULED), (tallies.LEASE_EXPIRATIONS,)),
        (
            "LeaseExpired",
            job(S.RUNNING),
            job(S.DEAD),
            (tallies.LEASE_EXPIRATIONS, tallies.DEAD_LETTERS),
        ),
        ("JobCancelled", job(S.SCHEDULED), job(S.CANCELLED), (tallies.CANCELLED,)),
        # a job may begin cancelled (a workflow child of an unknown parent)
        ("JobEnqueued", None, job(S.CANCELLED), (tallies.CANCELLED,)),
        # already there: entering is counted once
        ("JobCancelled", job(S.CANCELLED), job(S.CANCELLED), ()),
        ("ChildRegistered", job(S.DEAD), job(S.DEAD), ()),
        ("JobRequeued", job(S.DEAD), job(S.SCHEDULED), ()),
        ("JobLeased", job(S.SCHEDULED), job(S.LEASED), ()),
        ("AttemptStarted", job(S.LEASED), job(S.RUNNING), ()),
    ],
)
def test_applied_events(
    kind: str, before: JobState | None, after: JobState, expected: tuple[str, ...]
) -> None:
    assert counted(kind, before, after) == expected


def test_stale_completions_count_and_other_stale_events_do_not() -> None:
    running = job(S.RUNNING)
    for kind in ("AttemptSucceeded", "AttemptFailed"):
        assert counted(kind, running, running, Verdict.STALE) == (tallies.STALE_COMPLETIONS,)
    assert counted("LeaseRenewed", running, running, Verdict.STALE) == ()
    assert counted("AttemptStarted", running, running, Verdict.STALE) == ()


def test_refused_events_count_nothing_whatever_their_kind() -> None:
    running, dead = job(S.RUNNING), job(S.DEAD)
    for verdict in (Verdict.REJECTED, Verdict.DUPLICATE, Verdict.CONFLICT):
        assert counted("AttemptFailed", running, running, verdict) == ()
        assert counted("JobEnqueued", dead, dead, verdict) == ()


def test_undecodable_records_count_and_purges_and_schedule_events_do_not() -> None:
    assert counted("undecodable", None, None, Verdict.UNDECODABLE) == (tallies.UNDECODABLE,)
    assert counted("JobPurged", job(S.DEAD), None) == ()  # a purge lowers no tally either
    assert counted("ScheduleFired", None, None) == ()


def test_every_tally_is_named_once_in_the_overviews_order() -> None:
    assert len(set(tallies.NAMES)) == len(tallies.NAMES)
    assert tallies.NAMES[:4] == (
        tallies.RETRIES,
        tallies.DEAD_LETTERS,
        tallies.STALE_COMPLETIONS,
        tallies.LEASE_EXPIRATIONS,
    )
