"""``?as_of=`` on the listings and stats: the parameter, its answers, and the indexes it reads."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import JSONResponse

from evsched.adapters.kafka.log_cut import MAX_CUT_CHARS, CutError
from evsched.api import reader
from evsched.api.as_of import BuildBusy, BuildFailed, PastIndexes, Until, resolved
from evsched.api.context import ApiContext
from evsched.api.errors import ApiError, ErrorBody
from evsched.api.models import AsOf, Building
from evsched.api.responses import Responses
from evsched.errors import BrokerUnavailable

# How long a request waits for an as-of index being built before it answers 202.
RETRY_AFTER_S = 2

AsOfQuery = Annotated[
    str | None,
    Query(
        max_length=MAX_CUT_CHARS,
        description="Answer as of this point of the log, from an index rebuilt to it (built on "
        "first use, then cached; a 202 while it is built): an RFC 3339 time with a zone "
        "(`2026-12-07T14:02:00Z`: every event the broker appended then or before, partition by "
        "partition), `P:OFFSET,...` (every partition's last offset) or one OFFSET for every "
        "partition. A time in the future, before the log's retention start, or text that is "
        "none of these is a 422 naming as_of.",
        json_schema_extra={"format": "evsched-as-of"},
    ),
]


AS_OF: Responses = {
    202: {"model": Building, "description": "as_of's index is being built: ask again."},
    503: {
        "model": ErrorBody,
        "description": "as_of: the broker did not answer, or too many as-of indexes are being "
        "built (with Retry-After).",
    },
}


class StillBuilding(Exception):
    """Raised by a route whose as-of index is not built yet; answered 202 by ``building``."""

    def __init__(self, as_of: AsOf) -> None:
        super().__init__(as_of.requested)
        self.as_of = as_of


async def building(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StillBuilding)
    body = Building(
        status="building",
        as_of=exc.as_of,
        message="the index as of this point is being built: ask again after Retry-After",
    )
    return JSONResponse(
        body.model_dump(), status_code=202, headers={"Retry-After": str(RETRY_AFTER_S)}
    )


async def past_indexes(ctx: ApiContext, text: str) -> tuple[PastIndexes, AsOf]:
    """The indexes as of ``text``; ApiError (422 naming as_of, 503) or StillBuilding."""
    until = await _resolve(ctx, text)
    as_of = AsOf(requested=text, offsets=dict(resolved(until)))
    try:
        found = await ctx.past.indexes(until, ctx.as_of_wait_s)
    except BuildBusy as exc:
        raise ApiError(
            503, "busy", str(exc), field="as_of", headers={"Retry-After": str(RETRY_AFTER_S)}
        ) from None
    except BuildFailed as exc:
        raise ApiError(422, "as_of_unavailable", str(exc), field="as_of") from None
    if found is None:
        raise StillBuilding(as_of)
    return found, as_of


async def _resolve(ctx: ApiContext, text: str) -> Until:
    try:
        return await ctx.past.resolve(text, len(reader.partitions(ctx.replica)))
    except CutError as exc:
        raise ApiError(422, "validation_error", f"as_of: {exc}", field="as_of") from None
    except BrokerUnavailable as exc:
        raise ApiError(
            503, "broker_unavailable", f"as_of: the log's offsets are unknown: {exc}"
        ) from None
