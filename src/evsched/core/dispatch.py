"""The dispatch record: what a node hands a worker with each lease, a hint and never the truth."""

from __future__ import annotations

from dataclasses import dataclass

from evsched.core.events import TraceContext


@dataclass(frozen=True, slots=True, kw_only=True)
class Dispatch:
    """Everything a stateless worker needs to run one attempt.

    ``partition`` is the events partition that owns the job; ``leased_at`` is the node's clock at
    decision time (informational: lease times come from the log). ``checkpoint`` is the last
    accepted checkpoint, so a re-run resumes from it.
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


def external_idempotency_key(job_id: str) -> str:
    """The key a handler passes to external systems: the same for every attempt of a job."""
    return f"evsched:{job_id}"
