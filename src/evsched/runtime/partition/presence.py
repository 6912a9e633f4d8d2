"""Which queues have a live worker, as a node knows it: its partitions lease only for those.

A job of a queue nobody serves used to be leased, wait out its dispatch timeout in the dispatch
topic, expire and be leased again: 54 events in 2 minutes for one job at a 5 s timeout, and about
58 million a day for 10,000 such jobs. Workers already announce themselves to Kafka: each pool is
the consumer group ``<ns>.workers.<pool>`` on its queues' dispatch topics. So the node asks the
pools' coordinators (``ports.WorkerPools``, at most once per ``REFRESH_S``, only while its
partitions plan leases or hold jobs back), and a job of a queue with no member holding a
partition of its dispatch topic stays scheduled, costing nothing, until one is seen; the node's
partitions are then woken at once. Nothing of this goes to the log: it only decides whether a
lease is proposed, as a full queue does.

It fails open: while the pools cannot be told (no Describe on the workers' groups, a broker
that does not answer), every queue is leased as before, and that is logged once, so a
permissions mistake never stalls work. A pool that is rebalancing counts as it was when last
stable. While the first look-up of a running node is on its way, nothing is leased: it answers
within milliseconds, or fails (then every queue is leased) within the admin client's timeout, so
a node that restarts over a day of waiting jobs does not lease them all once. Without ``run``
(nothing looks up) every queue is leased.

A queue whose dispatch topic is undeclared or misconfigured is the operator's to fix, worker or
not: held for want of a worker, it would never reach the queue checks that log it and quarantine
its decisions (``runtime.partition.quarantine``). So each look-up also checks the held queues'
topics (``ensure_queues``), and a queue found unusable counts as served, so it is planned as
before presence, until a check finds its topic usable. Its check is asked again only once the
hold of its quarantined decisions is over: a misconfigured topic costs the broker one request
per hold, not one per look-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections import Counter
from collections.abc import Callable, Mapping, Set
from typing import Any

from evsched.ports import Clock, WorkerPools
from evsched.runtime.partition.quarantine import QUARANTINE_S, EnsureQueues

# At most one look-up per node this often, and so the delay between a worker joining and its
# queue's waiting jobs being leased (plus the pool's rebalance).
REFRESH_S = 1.0
# Look-ups go on this long after a partition last planned leases (workers that left are seen).
DEMAND_S = 5.0


class WorkerPresence:
    """The node's view of which queues are served; ``run`` keeps it fresh while it is needed."""

    def __init__(
        self,
        pools: WorkerPools,
        clock: Clock,
        *,
        logger: Any,
        refresh_s: float = REFRESH_S,
        demand_s: float = DEMAND_S,
        ensure_queues: EnsureQueues | None = None,
    ) -> None:
        self._pools = pools
        self._ensure_queues = ensure_queues  # None: no queue is checked, held ones stay held
        self._clock = clock
        self._log = logger
        self.refresh_s = refresh_s
        self.demand_s = demand_s
        self._served: Counter[str] | None = None  # None: not known (yet, or failing): lease all
        self._answered_at = -math.inf
        self._asked_at = -math.inf
        self._stable: dict[str, Mapping[str, int]] = {}  # pool -> its queues when last stable
        self._held: dict[int, frozenset[str]] = {}  # partition -> queues it holds jobs of
        # Queues whose dispatch topic is unusable -> when their check may be asked again.
        self._unusable: dict[str, float] = {}
        self._check_told = False  # a failed queue check was logged since the last one passed
        self._kick = asyncio.Event()
        self.failing = True  # until the first answer
        self._told = False  # a failure was logged since the last answer
        self._first = False  # run's first look-up is on its way: hold every queue till it ends
        self.on_gain: Callable[[], None] | None = None  # wakes the node's partitions

    def staffed(self) -> Set[str] | None:
        """The queues some worker serves (None: not known, lease every queue). A partition asks
        at each plan: that keeps the look-ups going, and an old answer is asked again at once."""
        now = self._clock.monotonic_s()
        self._asked_at = now
        if now - self._answered_at >= self.refresh_s:
            self._kick.set()
        if self._first:
            return frozenset()
        if self._served is None:
            return None
        return self._served.keys() | self._unusable.keys()

    def held(self, partition: int, queues: Set[str]) -> None:
        """The queues ``partition`` holds due jobs of for want of a worker, as of its last plan."""
        if self._held.get(partition, frozenset()) != queues:
            # Copied, not changed in place: a metrics scrape reads it from another thread.
            held = {p: q for p, q in self._held.items() if p != partition}
            self._held = held | ({partition: frozenset(queues)} if queues else {})

    def forget(self, partition: int) -> None:
        self.held(partition, frozenset())

    def waiting(self) -> set[str]:
        """Queues with due jobs held back on this node because no worker serves them."""
        return set().union(*self._held.values())

    def workers(self) -> dict[str, int]:
        """Live pool members per served queue, as last told (empty while not known)."""
        return dict(self._served or {})

    async def close(self) -> None:
        await self._pools.close()

    async def run(self, stop: asyncio.Event) -> None:
        """Look up while partitions plan or hold jobs back; idle (no look-ups) otherwise."""
        stopped = asyncio.ensure_future(stop.wait())
        self._first = self._answered_at == -math.inf
        try:
            while not stop.is_set():
                if self._wanted():
                    await self.refresh()
                    self._kick.clear()
                    await _first(stopped, asyncio.sleep(self.refresh_s))
                else:
                    self._kick.clear()
                    await _first(stopped, self._kick.wait())
        finally:
            stopped.cancel()

    def _wanted(self) -> bool:
        recent = self._clock.monotonic_s() - self._asked_at < self.demand_s
        return recent or bool(self._held)

    async def refresh(self) -> None:
        """One look-up; wakes the partitions if a queue gained a worker or presence is unknown."""
        before = Counter[str]() if self._first else self._served
        try:
            pools = await self._pools.pools()
        except Exception as exc:  # fail open, whatever the cause: never stall work
            self._served = None
            if not self._told:
                self._log.warning("worker_presence_unknown", error=repr(exc), leasing="every queue")
            self.failing = self._told = True
        else:
            self._served = self._merge(pools)
            if self.failing:
                self._log.info("worker_presence_known", queues=sorted(self._served))
            self.failing = self._told = False
        self._answered_at = self._clock.monotonic_s()
        self._first = False
        after = self._served
        gained = before is not None and (after is None or bool(after.keys() - before.keys()))
        if (await self._check_queues() or gained) and self.on_gain is not None:
            self.on_gain()

    async def _check_queues(self) -> bool:
        """Check the topics of the queues held for want of a worker, and of those found unusable
        whose hold is over; True if a queue was found unusable anew (it is planned now)."""
        now = self._clock.monotonic_s()
        held = {q for q in self.waiting() if q not in self._unusable}
        due = held | {q for q, at in self._unusable.items() if at <= now}
        if self._ensure_queues is None or not due:
            return False
        try:
            found = await self._ensure_queues(due)
        except Exception as exc:  # the broker cannot be asked: looked at again next time
            if not self._check_told:
                self._log.warning("queue_check_failed", error=repr(exc), queues=sorted(due))
            self._check_told = True
            return False
        self._check_told = False
        fresh = found.keys() - self._unusable.keys()
        for queue in due - found.keys():
            self._unusable.pop(queue, None)
        for queue, why in found.items():
            self._unusable[queue] = now + (QUARANTINE_S if why.hold_s is None else why.hold_s)
        return bool(fresh)

    def _merge(self, pools: Mapping[str, Mapping[str, int] | None]) -> Counter[str]:
        served: Counter[str] = Counter()
        for pool, told in pools.items():
            if told is not None:
                self._stable[pool] = told
            # Rebalancing: its members are not told; they count as when it was last stable.
            queues = self._stable.get(pool, {})
            served.update({q: n for q, n in queues.items() if n > 0})
        for gone in self._stable.keys() - pools.keys():
            del self._stable[gone]
        return served


async def _first(stopped: asyncio.Future[Any], waiting: Any) -> None:
    """Wait for ``waiting`` or for the stop, whichever comes first."""
    task = asyncio.ensure_future(waiting)
    try:
        await asyncio.wait({stopped, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
