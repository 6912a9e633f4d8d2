"""Events a client and a worker would write, for NodeDriver tests: the node's side is real."""

from __future__ import annotations

import itertools

from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Effect,
    JobEnqueued,
    JobTemplate,
    RetryPolicy,
    ScheduleUpserted,
)

_ids = itertools.count()

# Backoff without jitter, so a test can name the exact retry time.
STEADY = RetryPolicy(initial_backoff_ms=1_000, max_backoff_ms=60_000, multiplier=2.0, jitter=0.0)


def _event_id(kind: str) -> str:
    return f"{kind}-{next(_ids)}"


def enqueued(
    job_id: str,
    *,
    queue: str = "default",
    run_at: int | None = None,
    max_attempts: int = 3,
    retry: RetryPolicy = STEADY,
) -> JobEnqueued:
    return JobEnqueued(
        event_id=_event_id("enq"), job_id=job_id, emitted_at=0, source="client", task="t",
        queue=queue, args=b"[]", run_at=run_at, max_attempts=max_attempts, retry=retry,
    )  # fmt: skip


def started(d: Dispatch, *, lease_ms: int = 10_000) -> AttemptStarted:
    return AttemptStarted(
        event_id=_event_id("start"), job_id=d.job_id, emitted_at=0, source="worker-1",
        token=d.token, worker_id="worker-1", lease_ms=lease_ms,
    )  # fmt: skip


def succeeded(d: Dispatch, *effects: Effect) -> AttemptSucceeded:
    return AttemptSucceeded(
        event_id=_event_id("ok"), job_id=d.job_id, emitted_at=0, source="worker-1",
        token=d.token, result=b"null", effects=effects,
    )  # fmt: skip


def failed(d: Dispatch, *, retryable: bool = True) -> AttemptFailed:
    return AttemptFailed(
        event_id=_event_id("fail"), job_id=d.job_id, emitted_at=0, source="worker-1",
        token=d.token, error_type="ValueError", message="boom", retryable=retryable,
    )  # fmt: skip


def every_minute(schedule_id: str) -> ScheduleUpserted:
    return ScheduleUpserted(
        event_id=_event_id("sched"), schedule_id=schedule_id, emitted_at=0, source="client",
        cron="* * * * *", timezone="UTC",
        template=JobTemplate(task="t", queue="default", args=b"[]"),
    )  # fmt: skip
