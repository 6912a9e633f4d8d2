"""The dispatch record: what a node hands a worker with each lease, a hint and never the truth."""

from __future__ import annotations

from dataclasses import dataclass, field

from evsched.core.events import TraceContext


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """Everything a stateless worker needs to run one attempt.

    ``partition`` is the events partition that owns the job; ``leased_at`` is the node's clock at
    decision time (informational: lease times come from the log). ``checkpoint`` is the last
    accepted checkpoint, so a re-run resumes from it. ``events_offset`` is where a worker follows
    the job from to learn when its attempt stops being current (``core.follow``).
    """

    job_id: str
    token: int
    attempt: int
    max_attempts: int
    task: str
    queue: str
    args: bytes
    timeout_ms: int
    lease_ms: int
    run_at: int
    enqueued_at: int
    leased_at: int
    partition: int
    checkpoint: bytes | None = None
    idempotency_key: str | None = None
    trace: TraceContext | None = None
    # The node's position in the events partition when it leased: the lease and everything
    # after it about the job lie at or past it (None from nodes before it was added).
    events_offset: int | None = None
    # The lease's key (adapters.proofs): the worker proves its attempt's events with it. None
    # from a node without node keys, or before it was added. Never shown in a repr.
    lease_key: bytes | None = field(default=None, repr=False)


# How much earlier than its start deadline a worker stops starting a dispatch: its AttemptStarted
# has to reach the log before the node expires the lease, and the node's and the worker's clocks
# may disagree by this much. At most a quarter of the dispatch's lease, for short leases.
START_MARGIN_MS = 1_000


def start_deadline(dispatch: Dispatch) -> int:
    """The last epoch-ms time at which a worker may start ``dispatch`` (its clock).

    The node expires a lease that was not started by ``leased_at + lease_ms`` (by the log's clock),
    so an attempt started later would run a handler for a lease that is gone: one more run of
    side effects, and a completion the fold rejects.
    """
    margin = min(START_MARGIN_MS, dispatch.lease_ms // 4)
    return start_window_opens(dispatch) + dispatch.lease_ms - margin


def start_deadline_by_log(dispatch: Dispatch) -> int:
    """When the lease ends by the log's clock, as near as a worker can know it.

    The fold refuses an AttemptStarted appended at or after the lease's ``lease_until`` (the
    JobLeased's log time plus ``lease_ms``); that log time is at or after ``leased_at``, so a start
    appended past this bound is refused or, within the clocks' skew, about to expire.
    """
    return start_window_opens(dispatch) + dispatch.lease_ms


def start_window_opens(dispatch: Dispatch) -> int:
    """When the lease's start window opens: at the lease, or at run_at for a pre-lease.

    A due job's run_at is at or before its lease; a pre-leased job's is after it, and the fold
    counts its ``lease_ms`` from run_at.
    """
    return max(dispatch.leased_at, dispatch.run_at)


def why_not_start(dispatch: Dispatch, *, now_ms: int, newest_token: int | None) -> str | None:
    """Why a worker must not start ``dispatch`` now, or None when it may.

    ``newest_token`` is the highest token this worker has already seen for the job: a dispatch at
    or below it is a duplicate or a superseded lease.
    """
    if newest_token is not None and dispatch.token < newest_token:
        return "superseded"
    if newest_token is not None and dispatch.token == newest_token:
        return "duplicate"
    if now_ms > start_deadline(dispatch):
        return "expired"
    return None


def external_idempotency_key(job_id: str) -> str:
    """The key a handler passes to external systems: the same for every attempt of a job."""
    return f"evsched:{job_id}"
