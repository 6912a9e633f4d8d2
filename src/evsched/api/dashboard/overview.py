"""The overview's data: one snapshot of counters, series and partitions, built without a scan."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from evsched.adapters.clock import monotonic_s
from evsched.api import reader
from evsched.api.context import ApiContext
from evsched.api.dashboard.live import Live
from evsched.core.state import Status
from evsched.errors import EvschedError

LAG_EVERY_S = 2.0


@dataclass(slots=True)
class LagCache:
    """The replica's lag per partition, asked of the broker at most every ``LAG_EVERY_S``."""

    lag: dict[int, int] | None = None
    asked_at: float = -LAG_EVERY_S
    _asking: bool = field(default=False)

    async def refresh(self, ctx: ApiContext) -> None:
        if self._asking or monotonic_s() - self.asked_at < LAG_EVERY_S:
            return
        self._asking = True
        try:
            self.lag = await asyncio.wait_for(ctx.replica.lag(), ctx.lag_timeout_s)
        except (TimeoutError, EvschedError):
            self.lag = None
        finally:
            self.asked_at = monotonic_s()
            self._asking = False


def depth(ctx: ApiContext) -> dict[str, int]:
    """Scheduled jobs per queue: the queue's backlog, from the job counts."""
    return {q: s[Status.SCHEDULED] for q, s in ctx.metrics.jobs.by_queue().items()}


def snapshot(ctx: ApiContext, live: Live, lag: LagCache) -> dict[str, Any]:
    """Everything the overview shows, as JSON: counts, series, percentiles, partitions, workers."""
    by_queue = ctx.metrics.jobs.by_queue()
    statuses = {s.value: sum(q[s] for q in by_queue.values()) for s in Status}
    series = list(live.series)
    queues = sorted(by_queue)
    return {
        "version": live.version,
        "log_at": live.last_log_at,
        "total": sum(statuses.values()),
        "statuses": statuses,
        "queues": {q: {s.value: n for s, n in by_queue[q].items()} for q in queues},
        "series": {
            "t": [s.at_s for s in series],
            "started": [s.started for s in series],
            "finished": [s.finished for s in series],
            "depth": {
                q: [s.depth.get(q) for s in series[:-1]] + [by_queue[q][Status.SCHEDULED]]
                for q in queues
            }
            if series
            else {},
        },
        "percentiles": live.percentiles(),
        "totals": {
            k: live.totals[k]
            for k in ("retries", "dead_letters", "stale_completions", "lease_expirations")
        },
        "partitions": _partitions(ctx, live, lag),
        "workers": [{"id": w, "seen_at": at} for w, at in live.workers_seen()],
    }


def _partitions(ctx: ApiContext, live: Live, lag: LagCache) -> list[dict[str, Any]]:
    rows = []
    for p in reader.partitions(ctx.replica):
        decider = live.deciders.get(p)
        rows.append(
            {
                "partition": p,
                "applied_offset": ctx.replica.index(p).applied_offset(),
                "lag": None if lag.lag is None else lag.lag.get(p),
                "owner": None if decider is None else decider[0],
                "owner_seen_at": None if decider is None else decider[1],
            }
        )
    return rows
