"""The overview's data: one snapshot of counters, series and partitions, built without a scan."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from evsched.adapters.clock import monotonic_s
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.groups import GroupOwners
from evsched.adapters.kafka.topics import Topics
from evsched.api import reader
from evsched.api.as_of import PastIndexes
from evsched.api.context import ApiContext
from evsched.api.dashboard.live import Live
from evsched.core import tallies
from evsched.core.state import Status
from evsched.errors import EvschedError

ASK_EVERY_S = 2.0

T = TypeVar("T")


@dataclass(slots=True)
class BrokerFacts:
    """What only the broker knows, asked at most every ``ASK_EVERY_S``: the replica's lag per
    partition and which node the node group assigned each partition to (the ownership itself,
    not a guess from who wrote the last decision). ``close`` at shutdown."""

    lag: dict[int, int] | None = None
    owners: dict[int, str] | None = None
    asked_at: float = -ASK_EVERY_S
    _asking: bool = field(default=False)
    _groups: GroupOwners | None = field(default=None)

    async def refresh(self, ctx: ApiContext) -> None:
        if self._asking or monotonic_s() - self.asked_at < ASK_EVERY_S:
            return
        self._asking = True
        try:
            self.lag, self.owners = await asyncio.gather(
                _ask(ctx.replica.lag(), ctx.lag_timeout_s),
                _ask(self._owners(ctx), ctx.lag_timeout_s),
            )
        finally:
            self.asked_at = monotonic_s()
            self._asking = False

    async def close(self) -> None:
        groups, self._groups = self._groups, None
        if groups is not None:
            await groups.close()

    async def _owners(self, ctx: ApiContext) -> dict[int, str]:
        if self._groups is None:
            self._groups = GroupOwners(ctx.settings)
        topics = Topics(ctx.settings.namespace)
        members = await self._groups.ask(topics.node_group, topics.events)
        # Nodes join as client "evsched-node-<id>" and sign decisions as "node-<id>".
        return {p: client.removeprefix("evsched-") for p, client in members.items()}


async def _ask(question: Coroutine[Any, Any, T], timeout_s: float) -> T | None:
    try:
        return await asyncio.wait_for(question, timeout_s)
    except (TimeoutError, EvschedError):
        return None


def depth(ctx: ApiContext) -> dict[str, int]:
    """Scheduled jobs per queue: the queue's backlog, from the job counts."""
    return {q: s[Status.SCHEDULED] for q, s in ctx.metrics.jobs.by_queue().items()}


def snapshot(ctx: ApiContext, live: Live, facts: BrokerFacts) -> dict[str, Any]:
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
        "totals": totals(ctx),
        "partitions": _partitions(ctx, live, facts),
        "workers": [{"id": w, "seen_at": at} for w, at in live.workers_seen()],
    }


async def overview_frame(ctx: ApiContext, live: Live, facts: BrokerFacts) -> str:
    """The snapshot as one server-sent event, built once per tick for every ``/live`` stream."""
    await facts.refresh(ctx)
    data = json.dumps(snapshot(ctx, live, facts), separators=(",", ":"))
    return f"event: overview\ndata: {data}\n\n"


def totals(ctx: ApiContext) -> dict[str, int]:
    """The namespace's lifetime tallies (core.tallies): each partition's index's, summed."""
    return _tallies(ctx.replica.index(p) for p in reader.partitions(ctx.replica))


def _tallies(indexes: Iterable[PartitionIndex]) -> dict[str, int]:
    found = dict.fromkeys(tallies.NAMES, 0)
    for index in indexes:
        for name, count in index.tallies().items():
            if name in found:  # a switch such as proofs_required is no count
                found[name] += count
    return found


def past_snapshot(past: PastIndexes) -> dict[str, Any]:
    """What the overview shows as of a point of the log: counts, tallies, applied offsets."""
    by_queue = past.by_queue()
    statuses = {s.value: sum(q[s] for q in by_queue.values()) for s in Status}
    return {
        "total": sum(statuses.values()),
        "statuses": statuses,
        "queues": {q: {s.value: n for s, n in counts.items()} for q, counts in by_queue.items()},
        "totals": _tallies(past.indexes.values()),
        "partitions": [
            {"partition": p, "applied_offset": index.applied_offset()}
            for p, index in sorted(past.indexes.items())
        ],
    }


def _partitions(ctx: ApiContext, live: Live, facts: BrokerFacts) -> list[dict[str, Any]]:
    rows = []
    for p in reader.partitions(ctx.replica):
        decider = live.deciders.get(p)
        rows.append(
            {
                "partition": p,
                "applied_offset": ctx.replica.index(p).applied_offset(),
                "lag": None if facts.lag is None else facts.lag.get(p),
                "owner": None if facts.owners is None else facts.owners.get(p),
                "last_decider": None if decider is None else decider[0],
                "last_decided_at": None if decider is None else decider[1],
            }
        )
    return rows
