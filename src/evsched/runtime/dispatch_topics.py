"""Dispatch topics a node creates on its first lease to a queue, once per queue and process.

A queue whose topic is refused (misconfigured, not creatable) is reported with the reason, so
its decisions are quarantined while every other queue's go out; a broker that cannot be asked
is raised, and the step is retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from evsched.adapters.topics import TopicMisconfigured, TopicRefused, ensure_topics
from evsched.settings import Settings


class QueueTopics:
    """The dispatch topics known to exist, shared by the partitions of one node."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._known: set[str] = set()
        self._lock = asyncio.Lock()

    async def ensure(self, queues: set[str]) -> Mapping[str, str]:
        """Create dispatch topics for queues this node has not sent to yet.

        Returns the queues whose topic was refused (misconfigured, not creatable), with the
        reason: their decisions are quarantined. Raises when the broker cannot be asked.
        """
        if queues <= self._known:
            return {}
        async with self._lock:  # partitions step concurrently: provision once
            new = queues - self._known
            if not new:
                return {}
            try:
                await self._ensure_queues(new)
            except (TopicMisconfigured, TopicRefused):
                return await self._ensure_each(new)  # find the culprits, create the others
            self._known |= new
            return {}

    async def _ensure_each(self, queues: set[str]) -> dict[str, str]:
        refused: dict[str, str] = {}
        for queue in sorted(queues):
            try:
                await self._ensure_queues({queue})
            except (TopicMisconfigured, TopicRefused) as exc:
                refused[queue] = str(exc)
            else:
                self._known.add(queue)
        return refused

    async def _ensure_queues(self, queues: set[str]) -> None:
        settings = self.settings
        await ensure_topics(
            settings.bootstrap,
            settings.namespace,
            event_partitions=settings.event_partitions,
            queues=sorted(queues),
            **dict(settings.kafka_options),
        )
