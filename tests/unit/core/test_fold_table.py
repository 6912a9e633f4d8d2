"""The fold's transition table: every status (and no state) against every job event kind.

The table is written out by hand so that any change to the fold's rules shows up as a diff here.
Token-carrying kinds are tried with the job's current token and with a stale one; ``JobLeased``
with the next token (``current``: the valid grant) and with the current one (``stale``: not
increasing); ``JobEnqueued`` with the same body and with a different one; ``JobPurged`` before the
retention ran out (purges that are due: test_retention.py).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from evsched.core.events import (
    JOB_EVENT_TYPES,
    AttemptCheckpointed,
    AttemptFailed,
    AttemptSnoozed,
    AttemptStarted,
    AttemptSucceeded,
    ChildRegistered,
    JobCancelled,
    JobEnqueued,
    JobEvent,
    JobLeased,
    JobPurged,
    JobRequeued,
    LeaseExpired,
    LeaseRenewed,
    ParentResolved,
    Position,
)
from evsched.core.fold import fold
from evsched.core.state import JobState
from evsched.core.state import Status as S
from evsched.core.state import Verdict as V

JOB = "job-1"
T0 = 1_000_000
LATER = T0 + 10_000_000  # past every run_at and lease_until the setups produce

# (status before, or None for an unknown job; event kind; variant) -> (verdict, status after)
TABLE: dict[tuple[S | None, str, str], tuple[V, S | None]] = {
    # an unknown job (no state)
    (None, "JobEnqueued", "same"): (V.APPLIED, S.SCHEDULED),
    (None, "JobEnqueued", "other"): (V.APPLIED, S.SCHEDULED),
    (None, "JobCancelled", "-"): (V.REJECTED, None),
    (None, "JobLeased", "current"): (V.REJECTED, None),
    (None, "JobLeased", "stale"): (V.REJECTED, None),
    (None, "AttemptStarted", "current"): (V.REJECTED, None),
    (None, "AttemptStarted", "stale"): (V.REJECTED, None),
    (None, "LeaseRenewed", "current"): (V.REJECTED, None),
    (None, "LeaseRenewed", "stale"): (V.REJECTED, None),
    (None, "AttemptCheckpointed", "current"): (V.REJECTED, None),
    (None, "AttemptCheckpointed", "stale"): (V.REJECTED, None),
    (None, "AttemptSucceeded", "current"): (V.REJECTED, None),
    (None, "AttemptSucceeded", "stale"): (V.REJECTED, None),
    (None, "AttemptFailed", "current"): (V.REJECTED, None),
    (None, "AttemptSnoozed", "current"): (V.REJECTED, None),
    (None, "AttemptFailed", "stale"): (V.REJECTED, None),
    (None, "AttemptSnoozed", "stale"): (V.REJECTED, None),
    (None, "LeaseExpired", "current"): (V.REJECTED, None),
    (None, "LeaseExpired", "stale"): (V.REJECTED, None),
    (None, "JobRequeued", "-"): (V.REJECTED, None),
    (None, "JobPurged", "-"): (V.REJECTED, None),
    # from scheduled
    (S.SCHEDULED, "JobEnqueued", "same"): (V.DUPLICATE, S.SCHEDULED),
    (S.SCHEDULED, "JobEnqueued", "other"): (V.CONFLICT, S.SCHEDULED),
    (S.SCHEDULED, "JobCancelled", "-"): (V.APPLIED, S.CANCELLED),
    (S.SCHEDULED, "JobLeased", "current"): (V.APPLIED, S.LEASED),
    (S.SCHEDULED, "JobLeased", "stale"): (V.REJECTED, S.SCHEDULED),
    (S.SCHEDULED, "AttemptStarted", "current"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptStarted", "stale"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "LeaseRenewed", "current"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "LeaseRenewed", "stale"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptCheckpointed", "current"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptCheckpointed", "stale"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptSucceeded", "current"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptSucceeded", "stale"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptFailed", "current"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptSnoozed", "current"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptFailed", "stale"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "AttemptSnoozed", "stale"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "LeaseExpired", "current"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "LeaseExpired", "stale"): (V.STALE, S.SCHEDULED),
    (S.SCHEDULED, "JobRequeued", "-"): (V.REJECTED, S.SCHEDULED),
    (S.SCHEDULED, "JobPurged", "-"): (V.REJECTED, S.SCHEDULED),
    # from leased
    (S.LEASED, "JobEnqueued", "same"): (V.DUPLICATE, S.LEASED),
    (S.LEASED, "JobEnqueued", "other"): (V.CONFLICT, S.LEASED),
    (S.LEASED, "JobCancelled", "-"): (V.APPLIED, S.CANCELLED),
    (S.LEASED, "JobLeased", "current"): (V.REJECTED, S.LEASED),
    (S.LEASED, "JobLeased", "stale"): (V.REJECTED, S.LEASED),
    # LATER is past the lease's start deadline: a start that late is refused (in time, it runs:
    # test_fold.py).
    (S.LEASED, "AttemptStarted", "current"): (V.REJECTED, S.LEASED),
    (S.LEASED, "AttemptStarted", "stale"): (V.STALE, S.LEASED),
    (S.LEASED, "LeaseRenewed", "current"): (V.REJECTED, S.LEASED),
    (S.LEASED, "LeaseRenewed", "stale"): (V.STALE, S.LEASED),
    (S.LEASED, "AttemptCheckpointed", "current"): (V.REJECTED, S.LEASED),
    (S.LEASED, "AttemptCheckpointed", "stale"): (V.STALE, S.LEASED),
    (S.LEASED, "AttemptSucceeded", "current"): (V.REJECTED, S.LEASED),
    (S.LEASED, "AttemptSucceeded", "stale"): (V.STALE, S.LEASED),
    (S.LEASED, "AttemptFailed", "current"): (V.REJECTED, S.LEASED),
    (S.LEASED, "AttemptSnoozed", "current"): (V.REJECTED, S.LEASED),
    (S.LEASED, "AttemptFailed", "stale"): (V.STALE, S.LEASED),
    (S.LEASED, "AttemptSnoozed", "stale"): (V.STALE, S.LEASED),
    (S.LEASED, "LeaseExpired", "current"): (V.APPLIED, S.SCHEDULED),
    (S.LEASED, "LeaseExpired", "stale"): (V.STALE, S.LEASED),
    (S.LEASED, "JobRequeued", "-"): (V.REJECTED, S.LEASED),
    (S.LEASED, "JobPurged", "-"): (V.REJECTED, S.LEASED),
    # from running
    (S.RUNNING, "JobEnqueued", "same"): (V.DUPLICATE, S.RUNNING),
    (S.RUNNING, "JobEnqueued", "other"): (V.CONFLICT, S.RUNNING),
    (S.RUNNING, "JobCancelled", "-"): (V.APPLIED, S.CANCELLED),
    (S.RUNNING, "JobLeased", "current"): (V.REJECTED, S.RUNNING),
    (S.RUNNING, "JobLeased", "stale"): (V.REJECTED, S.RUNNING),
    (S.RUNNING, "AttemptStarted", "current"): (V.REJECTED, S.RUNNING),
    (S.RUNNING, "AttemptStarted", "stale"): (V.STALE, S.RUNNING),
    (S.RUNNING, "LeaseRenewed", "current"): (V.APPLIED, S.RUNNING),
    (S.RUNNING, "LeaseRenewed", "stale"): (V.STALE, S.RUNNING),
    (S.RUNNING, "AttemptCheckpointed", "current"): (V.APPLIED, S.RUNNING),
    (S.RUNNING, "AttemptCheckpointed", "stale"): (V.STALE, S.RUNNING),
    (S.RUNNING, "AttemptSucceeded", "current"): (V.APPLIED, S.SUCCEEDED),
    (S.RUNNING, "AttemptSucceeded", "stale"): (V.STALE, S.RUNNING),
    (S.RUNNING, "AttemptFailed", "current"): (V.APPLIED, S.SCHEDULED),
    (S.RUNNING, "AttemptSnoozed", "current"): (V.APPLIED, S.SCHEDULED),
    (S.RUNNING, "AttemptFailed", "stale"): (V.STALE, S.RUNNING),
    (S.RUNNING, "AttemptSnoozed", "stale"): (V.STALE, S.RUNNING),
    (S.RUNNING, "LeaseExpired", "current"): (V.APPLIED, S.SCHEDULED),
    (S.RUNNING, "LeaseExpired", "stale"): (V.STALE, S.RUNNING),
    (S.RUNNING, "JobRequeued", "-"): (V.REJECTED, S.RUNNING),
    (S.RUNNING, "JobPurged", "-"): (V.REJECTED, S.RUNNING),
    # from succeeded
    (S.SUCCEEDED, "JobEnqueued", "same"): (V.DUPLICATE, S.SUCCEEDED),
    (S.SUCCEEDED, "JobEnqueued", "other"): (V.CONFLICT, S.SUCCEEDED),
    (S.SUCCEEDED, "JobCancelled", "-"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "JobLeased", "current"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "JobLeased", "stale"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptStarted", "current"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptStarted", "stale"): (V.STALE, S.SUCCEEDED),
    (S.SUCCEEDED, "LeaseRenewed", "current"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "LeaseRenewed", "stale"): (V.STALE, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptCheckpointed", "current"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptCheckpointed", "stale"): (V.STALE, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptSucceeded", "current"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptSucceeded", "stale"): (V.STALE, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptFailed", "current"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptSnoozed", "current"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptFailed", "stale"): (V.STALE, S.SUCCEEDED),
    (S.SUCCEEDED, "AttemptSnoozed", "stale"): (V.STALE, S.SUCCEEDED),
    (S.SUCCEEDED, "LeaseExpired", "current"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "LeaseExpired", "stale"): (V.STALE, S.SUCCEEDED),
    (S.SUCCEEDED, "JobRequeued", "-"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "JobPurged", "-"): (V.REJECTED, S.SUCCEEDED),
    # from dead
    (S.DEAD, "JobEnqueued", "same"): (V.DUPLICATE, S.DEAD),
    (S.DEAD, "JobEnqueued", "other"): (V.CONFLICT, S.DEAD),
    (S.DEAD, "JobCancelled", "-"): (V.REJECTED, S.DEAD),
    (S.DEAD, "JobLeased", "current"): (V.REJECTED, S.DEAD),
    (S.DEAD, "JobLeased", "stale"): (V.REJECTED, S.DEAD),
    (S.DEAD, "AttemptStarted", "current"): (V.REJECTED, S.DEAD),
    (S.DEAD, "AttemptStarted", "stale"): (V.STALE, S.DEAD),
    (S.DEAD, "LeaseRenewed", "current"): (V.REJECTED, S.DEAD),
    (S.DEAD, "LeaseRenewed", "stale"): (V.STALE, S.DEAD),
    (S.DEAD, "AttemptCheckpointed", "current"): (V.REJECTED, S.DEAD),
    (S.DEAD, "AttemptCheckpointed", "stale"): (V.STALE, S.DEAD),
    (S.DEAD, "AttemptSucceeded", "current"): (V.REJECTED, S.DEAD),
    (S.DEAD, "AttemptSucceeded", "stale"): (V.STALE, S.DEAD),
    (S.DEAD, "AttemptFailed", "current"): (V.REJECTED, S.DEAD),
    (S.DEAD, "AttemptSnoozed", "current"): (V.REJECTED, S.DEAD),
    (S.DEAD, "AttemptFailed", "stale"): (V.STALE, S.DEAD),
    (S.DEAD, "AttemptSnoozed", "stale"): (V.STALE, S.DEAD),
    (S.DEAD, "LeaseExpired", "current"): (V.REJECTED, S.DEAD),
    (S.DEAD, "LeaseExpired", "stale"): (V.STALE, S.DEAD),
    (S.DEAD, "JobRequeued", "-"): (V.APPLIED, S.SCHEDULED),
    (S.DEAD, "JobPurged", "-"): (V.REJECTED, S.DEAD),
    # from cancelled
    (S.CANCELLED, "JobEnqueued", "same"): (V.DUPLICATE, S.CANCELLED),
    (S.CANCELLED, "JobEnqueued", "other"): (V.CONFLICT, S.CANCELLED),
    (S.CANCELLED, "JobCancelled", "-"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "JobLeased", "current"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "JobLeased", "stale"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "AttemptStarted", "current"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "AttemptStarted", "stale"): (V.STALE, S.CANCELLED),
    (S.CANCELLED, "LeaseRenewed", "current"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "LeaseRenewed", "stale"): (V.STALE, S.CANCELLED),
    (S.CANCELLED, "AttemptCheckpointed", "current"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "AttemptCheckpointed", "stale"): (V.STALE, S.CANCELLED),
    (S.CANCELLED, "AttemptSucceeded", "current"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "AttemptSucceeded", "stale"): (V.STALE, S.CANCELLED),
    (S.CANCELLED, "AttemptFailed", "current"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "AttemptSnoozed", "current"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "AttemptFailed", "stale"): (V.STALE, S.CANCELLED),
    (S.CANCELLED, "AttemptSnoozed", "stale"): (V.STALE, S.CANCELLED),
    (S.CANCELLED, "LeaseExpired", "current"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "LeaseExpired", "stale"): (V.STALE, S.CANCELLED),
    (S.CANCELLED, "JobRequeued", "-"): (V.APPLIED, S.SCHEDULED),
    (S.CANCELLED, "JobPurged", "-"): (V.REJECTED, S.CANCELLED),
    # workflows (fold version 4): registrations, resolutions, and a job waiting on parents
    (None, "ChildRegistered", "-"): (V.REJECTED, None),
    (None, "ParentResolved", "waited"): (V.REJECTED, None),
    (None, "ParentResolved", "other"): (V.REJECTED, None),
    (S.SCHEDULED, "ChildRegistered", "-"): (V.APPLIED, S.SCHEDULED),
    (S.SCHEDULED, "ParentResolved", "waited"): (V.REJECTED, S.SCHEDULED),
    (S.SCHEDULED, "ParentResolved", "other"): (V.REJECTED, S.SCHEDULED),
    (S.LEASED, "ChildRegistered", "-"): (V.APPLIED, S.LEASED),
    (S.LEASED, "ParentResolved", "waited"): (V.REJECTED, S.LEASED),
    (S.LEASED, "ParentResolved", "other"): (V.REJECTED, S.LEASED),
    (S.RUNNING, "ChildRegistered", "-"): (V.APPLIED, S.RUNNING),
    (S.RUNNING, "ParentResolved", "waited"): (V.REJECTED, S.RUNNING),
    (S.RUNNING, "ParentResolved", "other"): (V.REJECTED, S.RUNNING),
    (S.SUCCEEDED, "ChildRegistered", "-"): (V.APPLIED, S.SUCCEEDED),
    (S.SUCCEEDED, "ParentResolved", "waited"): (V.REJECTED, S.SUCCEEDED),
    (S.SUCCEEDED, "ParentResolved", "other"): (V.REJECTED, S.SUCCEEDED),
    (S.DEAD, "ChildRegistered", "-"): (V.APPLIED, S.DEAD),
    (S.DEAD, "ParentResolved", "waited"): (V.REJECTED, S.DEAD),
    (S.DEAD, "ParentResolved", "other"): (V.REJECTED, S.DEAD),
    (S.CANCELLED, "ChildRegistered", "-"): (V.APPLIED, S.CANCELLED),
    (S.CANCELLED, "ParentResolved", "waited"): (V.REJECTED, S.CANCELLED),
    (S.CANCELLED, "ParentResolved", "other"): (V.REJECTED, S.CANCELLED),
    (S.WAITING, "JobEnqueued", "same"): (V.DUPLICATE, S.WAITING),
    (S.WAITING, "JobEnqueued", "other"): (V.CONFLICT, S.WAITING),
    (S.WAITING, "JobCancelled", "-"): (V.APPLIED, S.CANCELLED),
    (S.WAITING, "JobLeased", "current"): (V.REJECTED, S.WAITING),
    (S.WAITING, "JobLeased", "stale"): (V.REJECTED, S.WAITING),
    (S.WAITING, "AttemptStarted", "current"): (V.STALE, S.WAITING),
    (S.WAITING, "AttemptStarted", "stale"): (V.REJECTED, S.WAITING),
    (S.WAITING, "LeaseRenewed", "current"): (V.STALE, S.WAITING),
    (S.WAITING, "LeaseRenewed", "stale"): (V.REJECTED, S.WAITING),
    (S.WAITING, "AttemptCheckpointed", "current"): (V.STALE, S.WAITING),
    (S.WAITING, "AttemptCheckpointed", "stale"): (V.REJECTED, S.WAITING),
    (S.WAITING, "AttemptSucceeded", "current"): (V.STALE, S.WAITING),
    (S.WAITING, "AttemptSucceeded", "stale"): (V.REJECTED, S.WAITING),
    (S.WAITING, "AttemptFailed", "current"): (V.STALE, S.WAITING),
    (S.WAITING, "AttemptSnoozed", "current"): (V.STALE, S.WAITING),
    (S.WAITING, "AttemptFailed", "stale"): (V.REJECTED, S.WAITING),
    (S.WAITING, "AttemptSnoozed", "stale"): (V.REJECTED, S.WAITING),
    (S.WAITING, "LeaseExpired", "current"): (V.STALE, S.WAITING),
    (S.WAITING, "LeaseExpired", "stale"): (V.REJECTED, S.WAITING),
    (S.WAITING, "JobRequeued", "-"): (V.REJECTED, S.WAITING),
    (S.WAITING, "JobPurged", "-"): (V.REJECTED, S.WAITING),
    (S.WAITING, "ChildRegistered", "-"): (V.APPLIED, S.WAITING),
    (S.WAITING, "ParentResolved", "waited"): (V.APPLIED, S.WAITING),
    (S.WAITING, "ParentResolved", "other"): (V.REJECTED, S.WAITING),
}

_seq = itertools.count()


def _meta() -> dict[str, Any]:
    return {"event_id": f"e{next(_seq)}", "job_id": JOB, "emitted_at": 0, "source": "test"}


TOKEN_FIELDS: dict[type[JobEvent], dict[str, Any]] = {
    AttemptStarted: {"worker_id": "w1", "lease_ms": 30_000},
    LeaseRenewed: {"lease_ms": 30_000},
    AttemptCheckpointed: {"checkpoint": b"cp"},
    AttemptSucceeded: {"result": b"ok"},
    AttemptFailed: {"error_type": "E", "message": "boom"},
    AttemptSnoozed: {"delay_ms": 1_000, "max_snoozes": 25},
    LeaseExpired: {},
}


def _enqueue(args: bytes = b"{}") -> JobEnqueued:
    return JobEnqueued(**_meta(), task="t", queue="q", args=args)


def _lease(token: int, attempt: int) -> JobLeased:
    return JobLeased(**_meta(), token=token, attempt=attempt, lease_ms=30_000)


def _token_event(kind: type[JobEvent], token: int, **extra: Any) -> JobEvent:
    return kind(**_meta(), token=token, **TOKEN_FIELDS[kind], **extra)


def _run(events: list[JobEvent]) -> JobState:
    state: JobState | None = None
    for offset, event in enumerate(events):
        state, entry = fold(state, event, Position(partition=0, offset=offset, log_at=T0))
        assert entry.verdict is V.APPLIED, entry
    assert state is not None
    return state


PARENTS = ("p1", "p2")


def _setups() -> dict[S | None, JobState | None]:
    """One job per status; all but the unknown one hold token 1 after attempt 1."""
    leased = [_enqueue(), _lease(1, 1)]
    running = [*leased, _token_event(AttemptStarted, 1)]
    return {
        None: None,
        S.SCHEDULED: _run([*running, _token_event(AttemptFailed, 1)]),
        S.LEASED: _run(leased),
        S.RUNNING: _run(running),
        S.SUCCEEDED: _run([*running, _token_event(AttemptSucceeded, 1)]),
        S.DEAD: _run([*running, _token_event(AttemptFailed, 1, retryable=False)]),
        S.CANCELLED: _run([*running, JobCancelled(**_meta())]),
        S.WAITING: _run([JobEnqueued(**_meta(), task="t", queue="q", args=b"{}", after=PARENTS)]),
    }


SETUPS = _setups()


def _variants(kind: type[JobEvent]) -> tuple[str, ...]:
    if kind is JobEnqueued:
        return ("same", "other")
    if kind in (JobCancelled, JobRequeued, JobPurged, ChildRegistered):
        return ("-",)
    if kind is ParentResolved:  # from a parent the job waits on, or from another job
        return ("waited", "other")
    return ("current", "stale")


def _event(kind: type[JobEvent], variant: str, state: JobState | None) -> JobEvent:
    token = 1 if state is None else state.token
    attempt = 0 if state is None else state.attempt
    if kind is JobEnqueued:
        return _enqueue(b"{}" if variant == "same" else b"[]")
    if kind in (JobCancelled, JobRequeued):
        return kind(**_meta())
    if kind in (ChildRegistered, ParentResolved):
        return _workflow_event(kind, variant)
    if kind is JobPurged:  # within every setup's retention (the default, 7 days): too early
        return JobPurged(**_meta(), generation=0)
    if kind is JobLeased:
        return _lease(token + 1 if variant == "current" else token, attempt + 1)
    return _token_event(kind, token if variant == "current" else token - 1)


def _workflow_event(kind: type[JobEvent], variant: str) -> JobEvent:
    if kind is ChildRegistered:
        return ChildRegistered(**_meta(), child_id="c1")
    parent = PARENTS[0] if variant == "waited" else "x"
    return ParentResolved(
        **_meta(), parent_id=parent, outcome="succeeded", parent_partition=1, parent_offset=7
    )


CASES = [
    (status, kind, variant)
    for status in SETUPS
    for kind in JOB_EVENT_TYPES
    for variant in _variants(kind)
]


def test_the_table_covers_every_status_and_event_kind_exactly() -> None:
    assert set(TABLE) == {(status, kind.__name__, variant) for status, kind, variant in CASES}
    assert set(SETUPS) == {None, *S}
    assert {state.status for state in SETUPS.values() if state is not None} == set(S)


@pytest.mark.parametrize(
    ("status", "kind", "variant"),
    CASES,
    ids=[f"{status}-{kind.__name__}-{variant}" for status, kind, variant in CASES],
)
def test_transition(status: S | None, kind: type[JobEvent], variant: str) -> None:
    before = SETUPS[status]
    event = _event(kind, variant, before)

    after, entry = fold(before, event, Position(partition=0, offset=99, log_at=LATER))

    assert (entry.verdict, entry.status_after) == TABLE[(status, kind.__name__, variant)]
    assert entry.reason
    if entry.verdict is V.APPLIED:
        assert after is not None
        assert after.status is entry.status_after
        assert after.updated_at == LATER
        assert after.recent_event_ids[-1] == event.event_id
    else:
        assert after is before  # a refused event leaves the state untouched, not merely equal
