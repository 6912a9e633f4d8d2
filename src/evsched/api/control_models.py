"""Request and response bodies of the control endpoints: pause and resume, and batch enqueue."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field, StrictBool

from evsched.api.models import ControlReason, EnqueueRequest, Name, _Request, at
from evsched.core.controls import ControlState


class ControlRequest(_Request):
    reason: ControlReason = ""


class Switch(BaseModel):
    """One partition's view of a pause switch (a queue has one per events partition)."""

    partition: int
    paused: bool
    reason: str
    source: str
    changed_at: datetime

    @classmethod
    def of(cls, partition: int, state: ControlState) -> Switch:
        return cls(
            partition=partition,
            paused=state.paused,
            reason=state.reason,
            source=state.source,
            changed_at=at(state.changed_at),
        )


class QueueControl(BaseModel):
    """Whether a queue is paused: on every partition (``paused``), and per partition."""

    queue: str
    paused: bool
    partitions: list[Switch]


class QueueList(BaseModel):
    """Every declared queue (one dispatch topic each), by name, with its pause switches."""

    queues: list[QueueControl]


class ScheduleControl(BaseModel):
    schedule_id: str
    paused: bool
    switch: Switch | None


class BatchJob(EnqueueRequest):
    """One job of a batch: an enqueue body, with its Idempotency-Key as a field."""

    idempotency_key: Name | None = None


# Per request: a thousand jobs stay well inside the API's default 1 MiB body limit.
MAX_BATCH_JOBS = 1_000


class BatchRequest(_Request):
    jobs: Annotated[list[BatchJob], Field(min_length=1, max_length=MAX_BATCH_JOBS)]
    atomic: StrictBool = Field(
        False, description="All jobs in one Kafka transaction, or none (any refusal: none)."
    )


class BatchItem(BaseModel):
    """One job's verdict: ``accepted`` (new job), ``duplicate`` (same key and body: the existing
    job), ``conflict`` (same key, other body), ``invalid`` (``field`` says what), ``failed``
    (not written; for an atomic batch, nothing was)."""

    index: int
    outcome: str
    job_id: str | None = None
    field: str | None = None
    message: str = ""


class BatchResponse(BaseModel):
    written: int
    results: list[BatchItem]
