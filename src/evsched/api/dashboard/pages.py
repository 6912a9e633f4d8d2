"""The dashboard's read pages: overview (with its live stream), jobs, and one job's history."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from evsched.adapters.clock import monotonic_s, now_ms
from evsched.adapters.index.store import PartitionIndex
from evsched.api import reader
from evsched.api.dashboard.board import View, segment
from evsched.api.dashboard.history import picture, state_as_of
from evsched.api.dashboard.overview import past_snapshot, snapshot
from evsched.api.dashboard.session import Role
from evsched.api.dashboard.stream import LiveResponse
from evsched.api.errors import ApiError
from evsched.api.id_fields import JobId
from evsched.api.listing import Cursor, page
from evsched.api.models import AsOf, Job
from evsched.api.past import StillBuilding, past_indexes
from evsched.core.bounds import MAX_ID_BYTES, id_refusal
from evsched.core.ids import job_id_for_key
from evsched.core.state import JobState, Status

router = APIRouter(include_in_schema=False)
KEEPALIVE_S = 15.0
STREAM_S = 300.0  # a stream ends after this and the browser reconnects: shutdown never waits long


@router.get("/", response_class=HTMLResponse)
async def overview(
    view: View, as_of: Annotated[str | None, Query(max_length=2_000)] = None
) -> HTMLResponse:
    """The live overview; with ``as_of``, its counts as they were then (a static page)."""
    if as_of and as_of.strip():
        try:
            past, shown = await past_indexes(view.ctx, as_of.strip())
        except StillBuilding as building:
            return view.page("building.html", status_code=202, as_of=building.as_of)
        return view.page("overview_as_of.html", data=past_snapshot(past), as_of=shown)
    await view.board.facts.refresh(view.ctx)
    return view.page("overview.html", data=snapshot(view.ctx, view.board.live, view.board.facts))


@router.get("/overview.json")
async def overview_json(view: View) -> dict[str, Any]:
    await view.board.facts.refresh(view.ctx)
    return snapshot(view.ctx, view.board.live, view.board.facts)


@router.get("/live")
async def live(view: View, request: Request) -> LiveResponse:
    """Server-sent events: the shared snapshot whenever the replica committed something, throttled.

    503 with Retry-After past the open streams' cap (a smaller one for callers without a token).
    """
    anonymous = not view.board.sessions.auth or view.role is Role.NONE
    subscriber = view.board.feed.join(anonymous=anonymous)

    async def stream() -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        ends = monotonic_s() + STREAM_S
        while monotonic_s() < ends and not await request.is_disconnected():
            frame = await subscriber.next(KEEPALIVE_S)
            if subscriber.ended:
                return
            yield ": keepalive\n\n" if frame is None else frame

    return LiveResponse(stream(), feed=view.board.feed, subscriber=subscriber)


def _keep(
    *,
    status: Status | None,
    queue: str | None,
    task: str | None,
    label: str | None,
    since: int | None,
    until: int | None,
) -> Any:
    key, _, value = (label or "").partition("=")

    def keep(state: JobState) -> bool:
        return (
            (status is None or state.status is status)
            and (queue is None or state.queue == queue)
            and (task is None or state.task == task)
            and (not key or state.labels.get(key) == value)
            and (since is None or state.enqueued_at >= since)
            and (until is None or state.enqueued_at < until)
        )

    return keep


def _status(text: str | None) -> Status | None:
    if not text:
        return None
    try:
        return Status(text)
    except ValueError:
        message = "status: not a job status"
        raise ApiError(422, "validation_error", message, field="status") from None


def _ms(text: str | None, field: str) -> int | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ApiError(422, "validation_error", f"{field}: not a date-time", field=field) from None
    if moment.tzinfo is None:  # the form's fields are in UTC, as every time on the pages
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


Text = Annotated[str | None, Query(max_length=500)]


@router.get("/jobs", response_class=HTMLResponse, response_model=None)
async def jobs(
    view: View,
    *,
    status: Text = None,  # the form sends "" for any status
    queue: Text = None,
    task: Text = None,
    label: Text = None,
    since: Text = None,
    until: Text = None,
    find: Annotated[str | None, Query(max_length=MAX_ID_BYTES)] = None,  # an id, or a key
    find_queue: Text = None,
    cursor: Annotated[str | None, Query(max_length=2_000)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    as_of: Annotated[str | None, Query(max_length=2_000)] = None,
) -> HTMLResponse | RedirectResponse:
    """Jobs filtered by status, queue, task, label and enqueue time; or one found by id or key.

    With ``as_of``, the jobs as they were then (``GET /v1/jobs?as_of=``); while that index is
    built the page says so and reloads."""
    ctx = view.ctx
    index: Callable[[int], PartitionIndex] = ctx.replica.index
    shown: AsOf | None = None
    if as_of and as_of.strip():
        try:
            past, shown = await past_indexes(ctx, as_of.strip())
        except StillBuilding as building:
            return view.page("building.html", status_code=202, as_of=building.as_of)
        index = past.indexes.__getitem__
    if find:
        found = _find(view, find.strip(), (find_queue or "default").strip())
        if found is not None:
            return RedirectResponse(f"/jobs/{segment(found.job_id)}", status_code=303)
    keep = _keep(
        status=_status(status),
        queue=queue or None,
        task=task or None,
        label=label or None,
        since=_ms(since, "since"),
        until=_ms(until, "until"),
    )

    def rows(partition: int, after: str | None) -> Any:
        return ((s.job_id, s) for s in index(partition).jobs(after))

    found_page = page(
        reader.partitions(ctx.replica),
        rows,
        keep,
        cursor=None if not cursor else Cursor.decode(cursor),
        limit=limit,
        max_scan=ctx.max_scan,
    )
    filters = {
        "status": status or "",
        "queue": queue or "",
        "task": task or "",
        "label": label or "",
        "since": since or "",
        "until": until or "",
        "as_of": as_of or "",
    }
    return view.page(
        "jobs.html",
        jobs=found_page.items,
        next_cursor=found_page.next_cursor,
        scanned=found_page.scanned,
        filters=filters,
        statuses=list(Status),
        not_found=find if find else None,
        as_of=shown,
    )


def _find(view: View, needle: str, queue: str) -> JobState | None:
    """A job by its id, else by (queue, idempotency key)."""
    state = reader.job(view.ctx.replica, needle) if id_refusal("id", needle) is None else None
    if state is None:
        state = reader.job(view.ctx.replica, job_id_for_key(queue, needle))
    return state


# The events a job page lists and draws, the newest ones: a reused id (a skip schedule's job)
# keeps thousands within its retention; the API's timeline pages through them all.
TIMELINE_SHOWN = 500


@router.get("/jobs/{job_id:path}", response_class=HTMLResponse)
async def job(
    view: View, job_id: JobId, as_of: Annotated[int | None, Query(ge=0)] = None
) -> HTMLResponse:
    """The job now (or as of an offset of its history) and its timeline drawn as a picture."""
    replica = view.ctx.replica
    index = replica.index(replica.partition_of(job_id))
    current = index.job(job_id)
    entries = index.timeline(job_id, schedule=False)
    if current is None and not entries:
        return view.page("missing.html", status_code=404, what=f"job {job_id}")
    shown = current if as_of is None else state_as_of(index, job_id, as_of)
    # A reused id keeps a retention period of runs: the page draws the newest events only.
    newest = entries[-TIMELINE_SHOWN:]
    return view.page(
        "job.html",
        job_id=job_id,
        job=None if shown is None else Job.of(shown).model_dump(mode="json"),
        current_status=None if current is None else current.status.value,
        entries=newest,
        earlier=len(entries) - len(newest),
        as_of=as_of,
        chart=picture(newest, now_ms()).chart(),
    )
