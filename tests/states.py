"""Job states for tests: one neutral scheduled job; each test changes the fields it looks at."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from evsched.core.events import RetryPolicy
from evsched.core.state import JobState, Status

_BASE = JobState(
    job_id="j-1",
    status=Status.SCHEDULED,
    task="t",
    queue="q",
    args=b"{}",
    priority=0,
    run_at=0,
    max_attempts=3,
    retry=RetryPolicy(),
    timeout_ms=1_000,
    enqueued_at=0,
    updated_at=0,
    partition=0,
)


def job_state(job_id: str = "j-1", **changes: Any) -> JobState:
    return replace(_BASE, job_id=job_id, **changes)
