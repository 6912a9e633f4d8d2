"""``/v1/jobs``: enqueue, read, list, audit, cancel and requeue jobs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response

from evsched.adapters.clock import monotonic_s
from evsched.adapters.index.store import PartitionIndex
from evsched.api import reader
from evsched.api.context import Ctx, Writes
from evsched.api.errors import ApiError
from evsched.api.id_fields import JobId
from evsched.api.listing import Cursor, CursorQuery, page
from evsched.api.models import (
    CancelRequest,
    EnqueueRequest,
    Job,
    JobPage,
    RequeueRequest,
    Timeline,
    TimelineEvent,
)
from evsched.api.past import AS_OF, AsOfQuery, past_indexes
from evsched.api.queues import require_declared
from evsched.api.responses import READ, WRITE, Responses, error
from evsched.api.writes import cancel_event, enqueue_event, requeue_event
from evsched.commands import MAX_KEY_CHARS
from evsched.core.failures import MAX_CATEGORY_CHARS, category_of
from evsched.core.state import TERMINAL_STATUSES, JobState, Status, TimelineEntry, Verdict

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

# The longest long poll of GET /v1/jobs/{id}?wait=; each wait step re-reads the job.
MAX_WAIT_S = 60.0
WAIT_STEP_S = 1.0


FOUND: Responses = {404: error("No such job.")}


@router.post(
    "",
    status_code=201,
    response_model=Job,
    dependencies=[Writes],
    responses={
        **WRITE,
        200: {"model": Job, "description": "Same Idempotency-Key and body: the existing job."},
        409: error("Same Idempotency-Key, different body."),
    },
)
async def enqueue(
    ctx: Ctx,
    body: EnqueueRequest,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=MAX_KEY_CHARS,
            alias="Idempotency-Key",
            description="UTF-8 text: the job id is derived from (queue, key) exactly as the "
            "Python client derives it, so both make the same job.",
        ),
    ] = None,
) -> Job:
    """Enqueue a job; answers once the broker acknowledged it and this replica applied it."""
    key = _utf8_header(idempotency_key, "Idempotency-Key")
    event = enqueue_event(ctx.client, body, key, ctx.writer.now_ms())
    await require_declared(ctx.queues, event.queue, ctx.metrics)
    entry = await ctx.writer.write(event, f"/v1/jobs/{event.job_id}")
    if entry.verdict is Verdict.CONFLICT:
        raise ApiError(
            409,
            "idempotency_conflict",
            f"Idempotency-Key {key!r} already made job {event.job_id} with a different body",
            field="Idempotency-Key",
        )
    state = _judged(ctx, event.job_id, entry)
    response.headers["Evsched-Verdict"] = entry.verdict.value
    if entry.verdict is Verdict.APPLIED:
        response.headers["Location"] = f"/v1/jobs/{event.job_id}"
    else:
        response.status_code = 200
    return Job.of(state)


@router.get("/{job_id}", response_model=Job, responses={**READ, **FOUND})
async def get_job(
    ctx: Ctx,
    job_id: JobId,
    wait: Annotated[
        float | None,
        Query(
            ge=0,
            le=MAX_WAIT_S,
            description=f"Long poll: hold the answer up to this many seconds (at most "
            f"{MAX_WAIT_S:g}) until the job succeeded, died or was cancelled; then its "
            "result or last_error. The job as it is when the wait runs out otherwise.",
        ),
    ] = None,
) -> Job:
    state = _found(ctx, job_id)
    if wait:
        state = await _finished(ctx, state, wait)
    return Job.of(state)


@router.get("", response_model=JobPage, responses={**READ, **AS_OF})
async def list_jobs(
    ctx: Ctx,
    *,
    status: Status | None = None,
    queue: Annotated[str | None, Query(max_length=200)] = None,
    task: Annotated[str | None, Query(max_length=MAX_KEY_CHARS)] = None,
    category: Annotated[
        str | None,
        Query(
            max_length=MAX_CATEGORY_CHARS,
            description="Only jobs whose last failure is of this category: the dead-letter "
            "listing is ?status=dead&category=...",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: CursorQuery = None,
    as_of: AsOfQuery = None,
) -> JobPage:
    """Jobs in a stable order (partition, then id), filtered; reads at most the scan budget.

    With ``as_of``, the jobs as they were then (jobs purged since included, jobs enqueued since
    absent), from an index rebuilt to that point."""
    shown = None
    index: Callable[[int], PartitionIndex] = ctx.replica.index
    if as_of is not None:
        past, shown = await past_indexes(ctx, as_of)
        index = past.indexes.__getitem__

    def keep(state: JobState) -> bool:
        error = state.last_error
        return (
            (status is None or state.status is status)
            and (queue is None or state.queue == queue)
            and (task is None or state.task == task)
            and (category is None or (error is not None and category_of(error) == category))
        )

    def rows(partition: int, after: str | None) -> Any:
        return ((s.job_id, s) for s in index(partition).jobs(after))

    found = page(
        reader.partitions(ctx.replica),
        rows,
        keep,
        cursor=None if cursor is None else Cursor.decode(cursor),
        limit=limit,
        max_scan=ctx.max_scan,
    )
    return JobPage(
        jobs=[Job.of(s) for s in found.items],
        next_cursor=found.next_cursor,
        scanned=found.scanned,
        as_of=shown,
    )


@router.get(
    "/{job_id}/timeline",
    response_model=Timeline,
    responses={**READ, 404: error("Nothing was ever written for this id.")},
)
async def job_timeline(
    ctx: Ctx,
    job_id: JobId,
    after: Annotated[
        int, Query(ge=-1, le=reader.MAX_OFFSET, description="Events past this offset only.")
    ] = -1,
    limit: Annotated[int, Query(ge=1, le=reader.MAX_TIMELINE_PAGE)] = reader.TIMELINE_PAGE,
) -> Timeline:
    """Every event of the job with its verdict, rejected and stale ones included, a page at a
    time in log order.

    A reused id (a key past its window, a unique job, a skip or buffer schedule's job) shows its
    current run and the earlier runs still within their retention; older runs are on the events
    log or in an archive.
    """
    entries, next_after = reader.timeline_page(
        ctx.replica, job_id, schedule=False, after=after, limit=limit
    )
    if not entries and after < 0:
        raise ApiError(404, "not_found", f"no events for job {job_id!r}")
    events = [TimelineEvent.of(e) for e in entries]
    return Timeline(id=job_id, events=events, next_after=next_after)


@router.post(
    "/{job_id}/cancel",
    response_model=Job,
    dependencies=[Writes],
    responses={**WRITE, **FOUND, 409: error("The job is already finished.")},
)
async def cancel(ctx: Ctx, job_id: JobId, body: CancelRequest | None = None) -> Job:
    """Stop a job; a running attempt's later completion is then rejected."""
    _found(ctx, job_id)
    event = cancel_event(job_id, (body or CancelRequest()).reason, ctx.writer.now_ms())
    entry = await ctx.writer.write(event, f"/v1/jobs/{job_id}")
    return Job.of(_judged(ctx, job_id, entry))


@router.post(
    "/{job_id}/requeue",
    response_model=Job,
    dependencies=[Writes],
    responses={**WRITE, **FOUND, 409: error("The job is neither dead nor cancelled.")},
)
async def requeue(ctx: Ctx, job_id: JobId, body: RequeueRequest | None = None) -> Job:
    """Send a dead or cancelled job back to scheduled with a fresh attempt budget."""
    _found(ctx, job_id)
    event = requeue_event(job_id, body or RequeueRequest(), ctx.writer.now_ms())
    entry = await ctx.writer.write(event, f"/v1/jobs/{job_id}")
    return Job.of(_judged(ctx, job_id, entry))


async def _finished(ctx: Ctx, state: JobState, wait_s: float) -> JobState:
    """``state`` once terminal, as this replica folds its partition, or after ``wait_s``."""
    deadline = monotonic_s() + wait_s
    partition = ctx.replica.partition_of(state.job_id)
    while state.status not in TERMINAL_STATUSES:
        left = deadline - monotonic_s()
        if left <= 0:
            break
        following = ctx.replica.index(partition).applied_offset() + 1
        with contextlib.suppress(TimeoutError):  # nothing new folded: look again until the end
            await ctx.replica.wait_for(partition, following, timeout_s=min(left, WAIT_STEP_S))
        state = _found(ctx, state.job_id)
    return state


def _utf8_header(value: str | None, name: str) -> str | None:
    """A header's text as UTF-8: HTTP hands header bytes over as latin-1, clients send UTF-8."""
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        raise ApiError(422, "validation_error", f"{name} is not UTF-8 text", field=name) from None


def _found(ctx: Ctx, job_id: str) -> JobState:
    state = reader.job(ctx.replica, job_id)
    if state is None:
        raise ApiError(404, "not_found", f"no job {job_id!r}")
    return state


def _judged(ctx: Ctx, job_id: str, entry: TimelineEntry) -> JobState:
    """The job after a write the fold applied (or found a duplicate); 409 with its reason else."""
    if entry.verdict not in (Verdict.APPLIED, Verdict.DUPLICATE):
        raise ApiError(409, "transition_rejected", entry.reason)
    return _found(ctx, job_id)
