"""The dispatch topics a node may send to: declared queues only, checked once per queue and process.

A node never creates a topic (D.13): a queue is declared by an operator, a worker started for it
or ``evsched dev``. A job on an undeclared queue stays scheduled: its decisions are held back
(stage ``undeclared``) and planned again every few seconds, while the topic list is read at most
once per ``RECHECK_S`` for the whole node. A declared queue whose topic is misconfigured is
reported with the reason (stage ``topic``); a broker that cannot be asked is raised, and the
step is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from collections.abc import Set as AbstractSet

import structlog

from evsched.adapters.clock import monotonic_s
from evsched.adapters.kafka.queues import KafkaQueues, QueueCatalog, undeclared
from evsched.adapters.kafka.topics import (
    TopicMisconfigured,
    TopicMissing,
    TopicRefused,
    ensure_namespace_topics,
)
from evsched.runtime.partition.quarantine import Unusable
from evsched.settings import Settings

log = structlog.get_logger("evsched.node")

# How often the topic list is read again while decisions wait on an undeclared queue; they are
# held back as long, so a queue declared meanwhile gets its jobs leased within a few seconds.
RECHECK_S = 2.0
# How often the log repeats that a queue with waiting jobs is still undeclared.
REPORT_EVERY_S = 60.0


class QueueTopics:
    """The dispatch topics known to be usable, shared by the partitions of one node."""

    def __init__(self, settings: Settings, catalog: QueueCatalog | None = None) -> None:
        self.settings = settings
        self.catalog = catalog or KafkaQueues(settings, refresh_s=RECHECK_S)
        self._known: set[str] = set()
        self._reported: dict[str, float] = {}  # undeclared queue -> when it was last logged
        self._lock = asyncio.Lock()

    @property
    def known(self) -> AbstractSet[str]:
        """The queues whose dispatch topic was found usable (it only grows): the node's
        transactions ask no metadata of them again."""
        return self._known

    async def ensure(self, queues: set[str]) -> Mapping[str, Unusable]:
        """The queues whose dispatch topic can't be used (undeclared, misconfigured), and why.

        Their decisions are held back. Raises when the broker cannot be asked.
        """
        if queues <= self._known:
            return {}
        async with self._lock:  # partitions step concurrently: one look per queue
            new = queues - self._known
            unusable: dict[str, Unusable] = {}
            for queue in sorted(new):
                if not await self.catalog.declared(queue):
                    unusable[queue] = self._undeclared(queue)
            declared = new - unusable.keys()
            if declared:
                unusable |= await self._check_each(declared)
            return unusable

    def _undeclared(self, queue: str) -> Unusable:
        now = monotonic_s()
        last = self._reported.get(queue)
        if last is None or now - last >= REPORT_EVERY_S:
            self._reported[queue] = now
            log.warning("queue_undeclared", queue=queue, recheck_every_s=RECHECK_S)
        return Unusable(stage="undeclared", reason=undeclared(queue), hold_s=RECHECK_S)

    async def _check_each(self, queues: set[str]) -> dict[str, Unusable]:
        unusable: dict[str, Unusable] = {}
        try:
            await self._check(queues)
        except (TopicMisconfigured, TopicRefused, TopicMissing):
            for queue in sorted(queues):  # find the culprits; the others are usable
                if (problem := await self._problem(queue)) is not None:
                    unusable[queue] = problem
        usable = queues - unusable.keys()
        self._known |= usable
        for queue in usable:
            self._reported.pop(queue, None)
        return unusable

    async def _problem(self, queue: str) -> Unusable | None:
        try:
            await self._check({queue})
        except TopicMissing:  # deleted since the topic list was read
            return self._undeclared(queue)
        except (TopicMisconfigured, TopicRefused) as exc:
            return Unusable(stage="topic", reason=str(exc))
        return None

    async def _check(self, queues: set[str]) -> None:
        """Raises unless every queue's topic exists as evsched needs it; creates nothing."""
        await ensure_namespace_topics(self.settings, queues=sorted(queues), create=False)
