"""Liveness, readiness, job statistics and Prometheus metrics; all open to read."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from evsched.api import reader
from evsched.api.context import ApiContext, Ctx
from evsched.api.errors import ApiError
from evsched.api.models import AsOf, Health, PartitionStats, QueueStats, Ready, Stats
from evsched.api.past import AS_OF, AsOfQuery, past_indexes
from evsched.api.responses import READ, error
from evsched.core.state import Status
from evsched.errors import EvschedError

router = APIRouter(tags=["operations"])
# Probes and metrics stay open whatever the API's auth: orchestrators and scrapers carry no token.
reads = APIRouter(tags=["operations"])
# A fold failure's reason as /readyz shows it: enough to find the log line, not a record's content.
REASON_CHARS = 200


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """The process is up and serving HTTP."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Ready,
    responses={
        503: error(
            "The replica is not folding, fails to fold a partition, is behind, or the broker is "
            "unreachable."
        )
    },
)
async def readyz(ctx: Ctx) -> Ready:
    """Ready when the replica folds every partition and is within ``ready_max_lag`` records."""
    if not ctx.replica.running:
        raise ApiError(503, "not_ready", "the replica is not folding the log")
    if failing := ctx.replica.failing:
        # Reads of that partition are stale until the fold succeeds: route them elsewhere.
        reasons = "; ".join(
            f"partition {p}: {why[:REASON_CHARS]}" for p, why in sorted(failing.items())
        )
        raise ApiError(503, "not_ready", f"the replica fails to fold: {reasons}")
    lag = await _lag(ctx)
    if lag is None:
        raise ApiError(503, "not_ready", "the broker did not report the log's end in time")
    behind = {p: n for p, n in lag.items() if n > ctx.ready_max_lag}
    if behind:
        raise ApiError(
            503,
            "not_ready",
            f"the replica is more than {ctx.ready_max_lag} records behind on partitions "
            f"{sorted(behind)}",
        )
    return Ready(status="ready", lag={str(p): n for p, n in sorted(lag.items())})


@reads.get("/v1/stats", response_model=Stats, responses={**READ, **AS_OF})
async def stats(ctx: Ctx, as_of: AsOfQuery = None) -> Stats:
    """Jobs by status and by queue, kept up to date from the fold (no scan per request).

    With ``as_of``, as they were then: counted once from an index rebuilt to that point."""
    if as_of is not None:
        found, shown = await past_indexes(ctx, as_of)
        applied = {p: index.applied_offset() for p, index in sorted(found.indexes.items())}
        return _stats(found.by_queue(), applied, shown)
    _seeded(ctx)
    applied = {p: ctx.replica.index(p).applied_offset() for p in reader.partitions(ctx.replica)}
    return _stats(ctx.metrics.jobs.by_queue(), applied)


def _stats(
    by_queue: dict[str, dict[Status, int]], applied: dict[int, int], as_of: AsOf | None = None
) -> Stats:
    totals = {s: sum(statuses[s] for statuses in by_queue.values()) for s in Status}
    return Stats(
        total=sum(totals.values()),
        by_status=totals,
        by_queue={
            q: QueueStats(total=sum(statuses.values()), by_status=statuses)
            for q, statuses in by_queue.items()
        },
        partitions=[PartitionStats(partition=p, applied_offset=o) for p, o in applied.items()],
        as_of=as_of,
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}},
)
async def metrics(ctx: Ctx) -> Response:
    """Prometheus metrics of this API process and what its replica folds."""
    _seeded(ctx)
    applied = {p: ctx.replica.index(p).applied_offset() for p in reader.partitions(ctx.replica)}
    ctx.metrics.set_positions(applied, await _lag(ctx))
    body, content_type = ctx.metrics.render()
    return Response(body, media_type=content_type)


async def _lag(ctx: ApiContext) -> dict[int, int] | None:
    """The replica's lag per partition, or None when the broker does not answer in time."""
    try:
        return await asyncio.wait_for(ctx.replica.lag(), ctx.lag_timeout_s)
    except (TimeoutError, EvschedError):
        return None


def _seeded(ctx: ApiContext) -> None:
    if not ctx.metrics.jobs.seeded and ctx.replica.running:
        ctx.metrics.jobs.seed(ctx.replica.index(p) for p in reader.partitions(ctx.replica))
