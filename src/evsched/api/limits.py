"""``PUT/GET /v1/queues/{queue}/limit`` and ``/v1/keys/{key}/limit``: global concurrency and rate
limits as events (core.permits), written to the limit's home partition first, then everywhere;
the answer is read back from this API's replica once every partition folded it."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from evsched.api.context import Ctx, Writes
from evsched.api.control_models import ControlRequest
from evsched.api.errors import ApiError
from evsched.api.models import needs, whole
from evsched.api.responses import READ, WRITE
from evsched.api.writes import SOURCE, NotYetApplied
from evsched.client.limits import limit_event, publish_limit
from evsched.core import bounds
from evsched.core.events import KEY_PREFIX
from evsched.errors import InvalidEnqueue, PublishError

router = APIRouter(tags=["limits"])
QueueName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")]
KeyName = Annotated[str, Path(min_length=1, max_length=bounds.MAX_CONCURRENCY_KEY_BYTES)]
Count = Annotated[StrictInt, Field(ge=1, le=bounds.MAX_RUNNING)]
Window = Annotated[StrictInt, Field(ge=1, le=bounds.MAX_DURATION_MS)]


def _set_too(field: str, most: int) -> dict[str, Any]:
    """JSON Schema: ``field`` is present and an integer in its bounds (not null)."""
    bounded = {"type": "integer", "minimum": 1, "maximum": most}
    return {"required": [field], "properties": {field: bounded}}


class LimitRequest(ControlRequest):
    """The limits to hold from now on; a field left null removes that limit. ``rate_starts``
    and ``rate_per_ms`` go together: both set (a rate) or both null (none)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                needs("rate_starts", "integer", _set_too("rate_per_ms", bounds.MAX_DURATION_MS)),
                needs("rate_per_ms", "integer", _set_too("rate_starts", bounds.MAX_RUNNING)),
            ]
        },
    )

    _whole = field_validator("max_running", "rate_starts", "rate_per_ms", mode="before")(whole)

    max_running: Count | None = None
    rate_starts: Count | None = None
    rate_per_ms: Window | None = None


class LimitView(BaseModel):
    """A limit as its home partition folded it: its values, holders and waiting requests."""

    name: str
    home_partition: int
    max_running: int | None
    rate_starts: int | None
    rate_per_ms: int | None
    holders: list[str]
    waiting: int
    partitions_set: int


@router.put("/v1/queues/{queue}/limit", response_model=LimitView, dependencies=[Writes],
            responses=WRITE)  # fmt: skip
async def set_queue_limit(ctx: Ctx, queue: QueueName, body: LimitRequest) -> LimitView:
    """At most ``max_running`` of the queue's jobs leased or running at once, and at most
    ``rate_starts`` permits per ``rate_per_ms``, over every node and partition."""
    return await _set(ctx, queue, body, key=False)


@router.get("/v1/queues/{queue}/limit", response_model=LimitView, responses=READ)
async def get_queue_limit(ctx: Ctx, queue: QueueName) -> LimitView:
    """The queue's limits, holders and waiting requests, as its home partition folded them."""
    return _view(ctx, queue)


@router.put("/v1/keys/{key}/limit", response_model=LimitView, dependencies=[Writes],
            responses=WRITE)  # fmt: skip
async def set_key_limit(ctx: Ctx, key: KeyName, body: LimitRequest) -> LimitView:
    """The same limits for the jobs of a concurrency key, whatever their queue."""
    return await _set(ctx, key, body, key=True)


@router.get("/v1/keys/{key}/limit", response_model=LimitView, responses=READ)
async def get_key_limit(ctx: Ctx, key: KeyName) -> LimitView:
    """The key's limits, holders and waiting requests, as its home partition folded them."""
    return _view(ctx, KEY_PREFIX + key)


async def _set(ctx: Ctx, name: str, body: LimitRequest, *, key: bool) -> LimitView:
    if (body.rate_starts is None) != (body.rate_per_ms is None):
        missing = "rate_per_ms" if body.rate_per_ms is None else "rate_starts"
        raise ApiError(
            422,
            "validation_error",
            f"rate_starts and rate_per_ms go together: {missing} is missing",
            field=missing,
        )
    rate = None if body.rate_starts is None else (body.rate_starts, body.rate_per_ms or 0)
    try:
        event = limit_event(name, key=key, max_running=body.max_running, rate=rate,
                            reason=body.reason, now_ms=ctx.writer.now_ms())  # fmt: skip
    except InvalidEnqueue as exc:
        raise ApiError(422, "invalid", f"{exc.field}: {exc.reason}") from None
    event = replace(event, source=SOURCE)
    full = KEY_PREFIX + name if key else name
    try:
        written = await publish_limit(await ctx.client.event_log(), ctx.client.topics.events, event)
    except PublishError as exc:
        raise ApiError(503, "broker_unavailable", str(exc)) from exc
    path = f"/v1/keys/{name}/limit" if key else f"/v1/queues/{name}/limit"
    for appended in written:
        try:
            await ctx.replica.wait_for(
                appended.partition, appended.offset, ctx.writer.wait_timeout_s
            )
        except TimeoutError:
            raise NotYetApplied(full, appended, path) from None
    return _view(ctx, full)


def _view(ctx: Ctx, name: str) -> LimitView:
    home = ctx.replica.partition_of(name)
    state = ctx.replica.index(home).limit(name)
    partitions = ctx.replica.projectors
    return LimitView(
        name=name,
        home_partition=home,
        max_running=None if state is None else state.max_running,
        rate_starts=None if state is None else state.rate_starts,
        rate_per_ms=None if state is None else state.rate_per_ms,
        holders=[] if state is None else list(state.holders),
        waiting=0 if state is None else len(state.waiting),
        partitions_set=sum(
            1 for p in range(len(partitions)) if ctx.replica.index(p).limit(name) is not None
        ),
    )
