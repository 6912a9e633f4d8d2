"""``/v1/schedules``: create, replace, delete and read cron schedules."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from evsched.api import reader
from evsched.api.context import Ctx, Writes
from evsched.api.errors import ApiError
from evsched.api.id_fields import ScheduleId
from evsched.api.listing import Cursor, CursorQuery, page
from evsched.api.models import Schedule, SchedulePage, ScheduleRequest, Timeline, TimelineEvent
from evsched.api.queues import require_declared
from evsched.api.responses import READ, WRITE, Responses, error
from evsched.api.writes import delete_schedule_event, schedule_event
from evsched.core.state import ScheduleState, Verdict

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])

FOUND: Responses = {404: error("No such schedule (or it was deleted).")}


@router.put(
    "/{schedule_id}",
    response_model=Schedule,
    dependencies=[Writes],
    responses={
        **WRITE,
        201: {"model": Schedule, "description": "Created."},
        200: {"model": Schedule, "description": "Replaced."},
    },
)
async def put_schedule(
    ctx: Ctx, schedule_id: ScheduleId, body: ScheduleRequest, response: Response
) -> Schedule:
    """Create or replace a schedule; a slot already fired never fires again."""
    existed = reader.schedule(ctx.replica, schedule_id) is not None
    event = schedule_event(ctx.client, schedule_id, body, ctx.writer.now_ms())
    await require_declared(ctx.queues, event.template.queue, ctx.metrics)
    entry = await ctx.writer.write(event, f"/v1/schedules/{schedule_id}")
    if entry.verdict is not Verdict.APPLIED:
        # The cron checks passed, so the fold refused the expression itself (no slot left).
        raise ApiError(422, "validation_error", entry.reason, field="cron")
    response.status_code = 200 if existed else 201
    return Schedule.of(_found(ctx, schedule_id))


@router.delete(
    "/{schedule_id}",
    status_code=204,
    response_class=Response,
    dependencies=[Writes],
    responses={**WRITE, **FOUND},
)
async def delete_schedule(ctx: Ctx, schedule_id: ScheduleId) -> Response:
    _found(ctx, schedule_id)
    event = delete_schedule_event(schedule_id, ctx.writer.now_ms())
    entry = await ctx.writer.write(event, f"/v1/schedules/{schedule_id}")
    if entry.verdict is not Verdict.APPLIED:
        raise ApiError(404, "not_found", entry.reason)
    return Response(status_code=204)


@router.get("/{schedule_id}", response_model=Schedule, responses={**READ, **FOUND})
async def get_schedule(ctx: Ctx, schedule_id: ScheduleId) -> Schedule:
    return Schedule.of(_found(ctx, schedule_id))


@router.get(
    "/{schedule_id}/timeline",
    response_model=Timeline,
    responses={
        **READ,
        404: error(
            "Nothing the index keeps was written for this id (rejected events of a schedule it "
            "did not hold stay 7 days of log time)."
        ),
    },
)
async def schedule_timeline(
    ctx: Ctx,
    schedule_id: ScheduleId,
    after: Annotated[
        int, Query(ge=-1, le=reader.MAX_OFFSET, description="Events past this offset only.")
    ] = -1,
    limit: Annotated[int, Query(ge=1, le=reader.MAX_TIMELINE_PAGE)] = reader.TIMELINE_PAGE,
) -> Timeline:
    """Every upsert, delete, fire, pause and resume of the schedule with its verdict, a page at
    a time in log order.

    Rejected events of a schedule the index did not hold (an unknown id, or before the schedule
    was created) are kept 7 days of log time; older ones are on the events log or in an archive.
    """
    entries, next_after = reader.timeline_page(
        ctx.replica, schedule_id, schedule=True, after=after, limit=limit
    )
    if not entries and after < 0:
        raise ApiError(404, "not_found", f"no events for schedule {schedule_id!r}")
    events = [TimelineEvent.of(e) for e in entries]
    return Timeline(id=schedule_id, events=events, next_after=next_after)


@router.get("", response_model=SchedulePage, responses=READ)
async def list_schedules(
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: CursorQuery = None,
) -> SchedulePage:
    """Live schedules in a stable order (partition, then id); deleted ones are left out."""

    def rows(partition: int, after: str | None) -> Any:
        return ((s.schedule_id, s) for s in ctx.replica.index(partition).schedules(after))

    found = page(
        reader.partitions(ctx.replica),
        rows,
        lambda s: not s.deleted,
        cursor=None if cursor is None else Cursor.decode(cursor),
        limit=limit,
        max_scan=ctx.max_scan,
    )
    return SchedulePage(
        schedules=[Schedule.of(s) for s in found.items],
        next_cursor=found.next_cursor,
        scanned=found.scanned,
    )


def _found(ctx: Ctx, schedule_id: str) -> ScheduleState:
    state = reader.schedule(ctx.replica, schedule_id)
    if state is None:
        raise ApiError(404, "not_found", f"no schedule {schedule_id!r}")
    return state
