"""The producer starts of partitions a node reopens, run beside its poll loop instead of in it.

A partition reopened after a failed step or a transaction the broker aborted
(``runtime.node.ownership``), or opened once its index was restored
(``runtime.node.index_restore``), needs the
node's transactional producer started (again, after a fatal error), and its start waits for the
transaction coordinator, which
cannot answer while its own partition of ``__transaction_state`` lacks in-sync replicas: for as
long as the brokers stay down. Awaited in the poll loop under the node's lock, that wait held every
other partition's records, and the group's rebalance callbacks, behind it. Here each start is a
task of its own; the poll loop takes the started outbox once it is ready (the partition stays
closed until then) and goes on stepping the others meanwhile. A revoke gives the start up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

import structlog

log = structlog.get_logger("evsched.node")


class Closable(Protocol):
    async def close(self) -> None: ...


OutboxT = TypeVar("OutboxT", bound=Closable)


class OutboxStarts(Generic[OutboxT]):
    """One outbox start per partition, in its own task; ``start`` makes and starts one."""

    def __init__(self, start: Callable[[int], Awaitable[OutboxT]], *, logger: Any = log) -> None:
        self._start = start
        self._log = logger
        self._tasks: dict[int, asyncio.Task[OutboxT]] = {}

    def take(self, partition: int) -> OutboxT | Exception | None:
        """The partition's started outbox, or why its start failed; None while it starts (the
        first call starts it). What is returned is the caller's: to use or to close."""
        task = self._tasks.get(partition)
        if task is None:
            self.begin(partition)
            return None
        if not task.done():
            return None
        del self._tasks[partition]
        if task.cancelled():  # not by us (cancel() forgets its tasks): start again next time
            return None
        failure = task.exception()
        if failure is None:
            return task.result()
        if isinstance(failure, Exception):
            return failure
        raise failure  # KeyboardInterrupt and the like are not a failed start

    def begin(self, partition: int) -> None:
        """Start the partition's outbox, unless its start is under way or waits to be taken."""
        if partition not in self._tasks:
            self._tasks[partition] = asyncio.create_task(
                self._started(partition), name=f"evsched-outbox-start-{partition}"
            )

    def starting(self) -> set[int]:
        """The partitions whose start is under way or not taken yet."""
        return set(self._tasks)

    async def cancel(self, partitions: Iterable[int]) -> None:
        """Give up the starts of ``partitions`` (revoked): an outbox already started is closed."""
        tasks = [task for p in partitions if (task := self._tasks.pop(p, None)) is not None]
        for task in tasks:
            task.cancel()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if not isinstance(outcome, BaseException):
                await outcome.close()

    async def _started(self, partition: int) -> OutboxT:
        self._log.info("partition_producer_starting", partition=partition)
        outbox = await self._start(partition)
        self._log.info("partition_producer_started", partition=partition)
        return outbox
