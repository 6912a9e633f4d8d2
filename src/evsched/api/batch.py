"""``POST /v1/jobs:batch``: many enqueues in one request and one round trip to the broker.

Each job is checked like ``POST /v1/jobs`` (its Idempotency-Key is a field of the job); the
valid ones are produced together (``atomic``: in one Kafka transaction, all or none), then each
job's verdict is read back from this API's replica, so ``duplicate`` and ``conflict`` are the
fold's verdicts against the whole history, not only within the batch.
"""

from __future__ import annotations

from fastapi import APIRouter

from evsched.api.context import Ctx, Writes
from evsched.api.control_models import BatchItem, BatchJob, BatchRequest, BatchResponse
from evsched.api.errors import ApiError
from evsched.api.queues import require_declared
from evsched.api.responses import WRITE
from evsched.api.writes import enqueue_event
from evsched.client.batch import BatchResult, Outcome, refuse_cycles, write_batch
from evsched.core.events import JobEnqueued
from evsched.core.state import Verdict
from evsched.errors import InvalidEnqueue, InvalidTask

router = APIRouter(tags=["jobs"])

_VERDICTS = {
    Verdict.APPLIED: Outcome.ACCEPTED,
    Verdict.DUPLICATE: Outcome.DUPLICATE,
    Verdict.CONFLICT: Outcome.CONFLICT,
}


@router.post("/v1/jobs:batch", response_model=BatchResponse, dependencies=[Writes], responses=WRITE)
async def enqueue_batch(ctx: Ctx, body: BatchRequest) -> BatchResponse:
    """Enqueue up to 1,000 jobs at once; a verdict per job, in the request's order.

    A batch whose jobs wait on one another in a cycle (``after``) is refused whole with a 422
    naming them: none of them could ever run.

    One timeout bounds the whole batch: the send, then the read-back of every job's verdict.
    """
    now = ctx.writer.now_ms()
    items = [await _event(ctx, job, now) for job in body.jobs]
    refuse_cycles(items)  # a 422 naming the jobs, before anything is written
    deadline = ctx.writer.deadline()
    sending = _write(ctx, items, atomic=body.atomic)
    results = await ctx.writer.send(sending, "batch", "/v1/jobs")
    judged = [await _judged(ctx, result, deadline) for result in results]
    written = sum(1 for r in results if r.appended is not None)
    return BatchResponse(written=written, results=judged)


async def _write(
    ctx: Ctx, items: list[JobEnqueued | InvalidEnqueue], *, atomic: bool
) -> list[BatchResult]:
    log = await ctx.client.event_log()
    return await write_batch(log, ctx.client.topics.events, items, atomic=atomic)


async def _event(ctx: Ctx, job: BatchJob, now: int) -> JobEnqueued | InvalidEnqueue:
    try:
        event = enqueue_event(ctx.client, job, job.idempotency_key, now)
        await require_declared(ctx.queues, event.queue, ctx.metrics)
    except (InvalidEnqueue, InvalidTask) as exc:
        return InvalidEnqueue(exc.field, exc.reason)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return InvalidEnqueue(exc.field or "queue", exc.message)
    return event


async def _judged(ctx: Ctx, result: BatchResult, deadline: float) -> BatchItem:
    """The fold's verdict of a written job, once this replica applied it (by ``deadline``)."""
    item = BatchItem(
        index=result.index,
        outcome=result.outcome.value,
        job_id=result.job_id,
        field=result.field,
        message=result.message,
    )
    appended = result.appended
    if appended is None or result.job_id is None:
        return item
    entry = await ctx.writer.entry_at(result.job_id, appended, deadline)
    if entry is None:
        item.message = f"written at p{appended.partition}@{appended.offset}, not yet applied here"
        return item
    outcome = _VERDICTS.get(entry.verdict, Outcome.INVALID)
    item.outcome = outcome.value
    item.message = entry.reason
    item.field = "idempotency_key" if outcome is Outcome.CONFLICT else None
    return item
