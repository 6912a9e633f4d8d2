"""``/v1/queues`` and ``/v1/schedules/{id}``: declared queues, and pause and resume as events.

A queue's pause goes to every events partition; the answer says how many partitions applied it
(and how many already had it), read back from this API's replica.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Path

from evsched.adapters.kafka.queues import QueueLookupError
from evsched.api import reader
from evsched.api.context import Ctx, Writes
from evsched.api.control_models import (
    ControlRequest,
    QueueControl,
    QueueList,
    ScheduleControl,
    Switch,
)
from evsched.api.errors import ApiError
from evsched.api.id_fields import ScheduleId
from evsched.api.responses import READ, WRITE, error
from evsched.api.writes import SOURCE, NotYetApplied
from evsched.client.controls import control_event
from evsched.core.controls import QUEUE, SCHEDULE
from evsched.core.events import (
    ControlEvent,
    QueuePaused,
    QueueResumed,
    SchedulePaused,
    ScheduleResumed,
)
from evsched.core.state import Verdict

router = APIRouter(tags=["controls"])
QueueName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")]


@router.post(
    "/v1/queues/{queue}/pause", response_model=QueueControl, dependencies=[Writes], responses=WRITE
)
async def pause_queue(ctx: Ctx, queue: QueueName, body: ControlRequest) -> QueueControl:
    """No new leases on the queue (on every partition); running jobs finish."""
    return await _queue_control(ctx, QueuePaused, queue, body.reason)


@router.post(
    "/v1/queues/{queue}/resume", response_model=QueueControl, dependencies=[Writes], responses=WRITE
)
async def resume_queue(ctx: Ctx, queue: QueueName, body: ControlRequest) -> QueueControl:
    """Lease the queue's due jobs again."""
    return await _queue_control(ctx, QueueResumed, queue, body.reason)


@router.get(
    "/v1/queues",
    response_model=QueueList,
    responses={**READ, 503: error("The broker could not list the dispatch topics; retriable.")},
)
async def list_queues(ctx: Ctx) -> QueueList:
    """The declared queues, by name, each with whether it is paused, per events partition."""
    try:
        names = await ctx.queues.names()
    except QueueLookupError as exc:
        raise ApiError(503, "broker_unavailable", str(exc)) from exc
    return QueueList(queues=[_queue_view(ctx, name) for name in names])


@router.get("/v1/queues/{queue}", response_model=QueueControl, responses=READ)
async def get_queue(ctx: Ctx, queue: QueueName) -> QueueControl:
    """Whether the queue is paused, per events partition."""
    return _queue_view(ctx, queue)


@router.post(
    "/v1/schedules/{schedule_id}/pause",
    response_model=ScheduleControl,
    dependencies=[Writes],
    responses={**WRITE, 404: error("No such schedule."), 409: error("Already paused.")},
)
async def pause_schedule(
    ctx: Ctx, schedule_id: ScheduleId, body: ControlRequest
) -> ScheduleControl:
    """No slot fires while the schedule is paused."""
    return await _schedule_control(ctx, SchedulePaused, schedule_id, body.reason)


@router.post(
    "/v1/schedules/{schedule_id}/resume",
    response_model=ScheduleControl,
    dependencies=[Writes],
    responses={**WRITE, 404: error("No such schedule."), 409: error("Not paused.")},
)
async def resume_schedule(
    ctx: Ctx, schedule_id: ScheduleId, body: ControlRequest
) -> ScheduleControl:
    """Slots fire again. Of the slots missed while paused, the newest fires; with a catch-up
    window, each one within the window fires, oldest first, and older ones are skipped."""
    return await _schedule_control(ctx, ScheduleResumed, schedule_id, body.reason)


async def _queue_control(
    ctx: Ctx, kind: type[ControlEvent], queue: str, reason: str
) -> QueueControl:
    event = _sourced(kind, queue, reason, ctx.writer.now_ms())
    location = f"/v1/queues/{queue}"
    deadline = ctx.writer.deadline()
    sending = ctx.client.publish_control_everywhere(event)
    for appended in await ctx.writer.send(sending, queue, location):
        if not await ctx.writer.applied(appended, deadline):
            raise NotYetApplied(queue, appended, location)
    return _queue_view(ctx, queue)


def _queue_view(ctx: Ctx, queue: str) -> QueueControl:
    switches = []
    for partition in reader.partitions(ctx.replica):
        state = ctx.replica.index(partition).control(QUEUE, queue)
        if state is not None:
            switches.append(Switch.of(partition, state))
    everywhere = len(switches) == len(reader.partitions(ctx.replica))
    paused = everywhere and all(s.paused for s in switches)
    return QueueControl(queue=queue, paused=paused, partitions=switches)


async def _schedule_control(
    ctx: Ctx, kind: type[ControlEvent], schedule_id: str, reason: str
) -> ScheduleControl:
    event = _sourced(kind, schedule_id, reason, ctx.writer.now_ms())
    entry = await ctx.writer.write(event, f"/v1/schedules/{schedule_id}")
    if entry.verdict is Verdict.REJECTED:
        missing = reader.schedule(ctx.replica, schedule_id) is None
        status, code = (404, "not_found") if missing else (409, "conflict")
        raise ApiError(status, code, entry.reason)
    return schedule_view(ctx, schedule_id)


def schedule_view(ctx: Ctx, schedule_id: str) -> ScheduleControl:
    partition = ctx.replica.partition_of(schedule_id)
    state = ctx.replica.index(partition).control(SCHEDULE, schedule_id)
    return ScheduleControl(
        schedule_id=schedule_id,
        paused=state is not None and state.paused,
        switch=None if state is None else Switch.of(partition, state),
    )


def _sourced(kind: type[ControlEvent], name: str, reason: str, now_ms: int) -> ControlEvent:
    return replace(control_event(kind, name, reason=reason, now_ms=now_ms), source=SOURCE)
