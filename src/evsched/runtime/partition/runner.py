"""An owned partition's inbox of fetched records and the task that steps it."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Coroutine
from typing import Any, Protocol

from evsched.errors import PartitionRevoked
from evsched.ports import Record
from evsched.runtime.partition.partition import OwnedPartition


class Fetches(Protocol):
    """Holds back and lets through a partition's fetches (the node's group consumer)."""

    def pause(self, partition: int) -> None: ...

    def resume(self, partition: int) -> None: ...


class PartitionRunner:
    """An owned partition's inbox of fetched records and the task that steps it.

    The poll loop feeds records in; the runner takes them out. A partition whose inbox grows past
    ``backlog`` is paused at the consumer until its runner catches up, so a slow partition holds
    back only its own fetches and memory stays bounded.
    """

    def __init__(self, owner: OwnedPartition, consumer: Fetches, backlog: int = 8_000):
        self.owner = owner
        self.consumer = consumer
        self.backlog = backlog
        self.inbox: deque[Record] = deque()
        # The offset after the last record fed: where fetching resumes after a rebalance.
        self.fetched_to = owner.resume_offset
        self.closing = False
        self.paused = False
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        if owner.instruments is not None:  # read at scrape time, nothing on the fetch path
            owner.instruments.inbox.set_function(lambda: 0 if self.closing else len(self.inbox))

    def start(self, run: Coroutine[Any, Any, None]) -> None:
        self._task = asyncio.create_task(run, name=f"evsched-partition-{self.owner.partition}")

    async def stopped(self) -> None:
        """Close, and wait until a step in flight has finished its transaction."""
        self.close()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def feed(self, records: list[Record]) -> None:
        fresh = [r for r in records if r.offset >= self.fetched_to]
        if not fresh or self.closing:
            return
        self.inbox.extend(fresh)
        self.fetched_to = fresh[-1].offset + 1
        self._kick.set()
        if len(self.inbox) >= self.backlog and not self.paused:
            self.consumer.pause(self.owner.partition)
            self.paused = True

    def take(self, limit: int) -> list[Record]:
        count = min(limit, len(self.inbox))
        records = [self.inbox.popleft() for _ in range(count)]
        if self.inbox:
            self._kick.set()  # more to do right away
        if self.paused and len(self.inbox) < self.backlog // 2 and not self.closing:
            self.paused = False
            with contextlib.suppress(PartitionRevoked):  # revoked meanwhile: nothing to resume
                self.consumer.resume(self.owner.partition)
        return records

    async def wait(self, timeout_s: float) -> None:
        """Until records arrive, the runner is closed, or ``timeout_s`` passes."""
        if not self._kick.is_set() and timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._kick.wait()
        self._kick.clear()

    def kick(self) -> None:
        """Step soon, even without records (another partition made room in a queue)."""
        self._kick.set()

    def close(self) -> None:
        self.closing = True
        self._kick.set()
