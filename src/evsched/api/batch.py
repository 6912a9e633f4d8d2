"""``POST /v1/jobs:batch``: many enqueues in one request and one round trip to the broker.

Each job is checked like ``POST /v1/jobs`` (its Idempotency-Key is a field of the job); the
valid ones are produced together (``atomic``: in one Kafka transaction, all or none), then each
job's verdict is read back from this API's replica, so ``duplicate`` and ``conflict`` are the
fold's verdicts against the whole history, not only within the batch.

Batches share the event loop, the producer and the replica with single enqueues, so they take
turns: at most ``MAX_BATCHES_IN_FLIGHT`` at once (the others wait, up to the write timeout, then
get a 503), and each yields to the loop every ``CHUNK`` jobs it builds or judges. Eight
concurrent 1,000-job batches otherwise held the loop for seconds and put 8,000 records ahead of
a single enqueue in the producer and the replica's fold (issue 32).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter

from evsched.api.context import MAX_BATCHES_IN_FLIGHT, Ctx, Writes
from evsched.api.control_models import BatchItem, BatchJob, BatchRequest, BatchResponse
from evsched.api.errors import ApiError
from evsched.api.queues import require_declared
from evsched.api.responses import WRITE, error
from evsched.api.writes import enqueue_event
from evsched.client.batch import BatchResult, Outcome, refuse_cycles, write_batch
from evsched.core.events import JobEnqueued
from evsched.core.state import Verdict
from evsched.errors import InvalidEnqueue, InvalidTask

router = APIRouter(tags=["jobs"])
CHUNK = 50  # jobs built or judged between two yields to the event loop (~5-15 ms of work)

_VERDICTS = {
    Verdict.APPLIED: Outcome.ACCEPTED,
    Verdict.DUPLICATE: Outcome.DUPLICATE,
    Verdict.CONFLICT: Outcome.CONFLICT,
}


BATCH_RESPONSES = {
    **WRITE,
    503: error(
        f"{WRITE[503]['description']} Or `busy` (with Retry-After): {MAX_BATCHES_IN_FLIGHT} "
        "batches were being written for the whole write timeout."
    ),
}


@router.post(
    "/v1/jobs:batch", response_model=BatchResponse, dependencies=[Writes], responses=BATCH_RESPONSES
)
async def enqueue_batch(ctx: Ctx, body: BatchRequest) -> BatchResponse:
    """Enqueue up to 1,000 jobs at once; a verdict per job, in the request's order.

    A batch whose jobs wait on one another in a cycle (``after``) is refused whole with a 422
    naming them: none of them could ever run.

    One timeout bounds the whole batch: the send, then the read-back of every job's verdict.
    A batch waits its turn first (at most that timeout too, then a 503 with Retry-After).
    """
    async with _turn(ctx):
        now = ctx.writer.now_ms()
        items = []
        for n, job in enumerate(body.jobs):
            if n and n % CHUNK == 0:
                await asyncio.sleep(0)
            items.append(await _event(ctx, job, now))
        refuse_cycles(items)  # a 422 naming the jobs, before anything is written
        deadline = ctx.writer.deadline()
        sending = _write(ctx, items, atomic=body.atomic)
        results = await ctx.writer.send(sending, "batch", "/v1/jobs")
        judged = []
        for n, result in enumerate(results):
            if n and n % CHUNK == 0:
                await asyncio.sleep(0)
            judged.append(await _judged(ctx, result, deadline))
    written = sum(1 for r in results if r.appended is not None)
    return BatchResponse(written=written, results=judged)


@asynccontextmanager
async def _turn(ctx: Ctx) -> AsyncIterator[None]:
    """One of the ``MAX_BATCHES_IN_FLIGHT`` places; ApiError 503 when none frees in time."""
    try:
        async with asyncio.timeout(ctx.writer.wait_timeout_s):
            await ctx.batches.acquire()
    except TimeoutError:
        raise ApiError(
            503,
            "busy",
            f"{MAX_BATCHES_IN_FLIGHT} batches are being written: retry, or send single jobs",
            headers={"Retry-After": "1"},
        ) from None
    try:
        yield
    finally:
        ctx.batches.release()


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
