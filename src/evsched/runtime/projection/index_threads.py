"""Blocking work on partitions' RocksDB indexes (open, close, restore writes), off the event loop.

A node's heartbeats, fetches and every partition's steps share one event loop. Index opens took
0.2-0.5 s each on a loaded machine, closes flush memtables, and a restore writes a whole
snapshot: run inline, each one held all of those (issue 9: the heir of a killed node missed its
own heartbeats and the group rebalanced once more). ``IndexThreads`` runs them on a small pool of
threads the node owns. One partition's calls run one after another, in the order they were
asked for, whatever happens to their callers: a cancelled caller's call still finishes before the
partition's next one starts, so no index handle is used by two threads at once, and a close
always comes before the reopen that follows it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from evsched.adapters.index.store import PartitionIndex
from evsched.runtime.process.offload import Offload, made
from evsched.runtime.projection.restore import open_index

T = TypeVar("T")

# Threads per node: a take-over opens its partitions side by side.
INDEX_THREADS = 4


class IndexThreads:
    """A node's threads for index calls, in order per partition (``run``)."""

    def __init__(self, threads: int = INDEX_THREADS) -> None:
        self._threads = threads
        self._pool: ThreadPoolExecutor | None = None  # started on first use
        self._tails: dict[int, asyncio.Task[Any]] = {}  # each partition's last call

    async def run(self, partition: int, call: Callable[[], T]) -> T:
        """``call()`` on a thread, after the partition's earlier calls.

        A caller cancelled meanwhile gets CancelledError at once; its call still runs to its
        end before the partition's next one (``offload.made`` undoes what it made).
        """
        return await asyncio.shield(self._chain(partition, lambda: self._thread(call)))

    def offload(self, partition: int) -> Offload:
        """``run`` bound to one partition, for code that only knows an ``Offload``."""

        async def bound(call: Callable[[], T]) -> T:
            return await self.run(partition, call)

        return bound

    async def open(self, data_dir: Path, partition: int) -> PartitionIndex:
        """The partition's index (``runtime.projection.restore.open_index``), opened on a thread."""
        opened = functools.partial(open_index, data_dir, partition)
        return await made(self.offload(partition), opened, PartitionIndex.close)

    async def close(self, index: PartitionIndex) -> None:
        """Close ``index`` on a thread (RocksDB flushes it first)."""
        await self.run(index.partition, index.close)

    async def stop(self) -> None:
        """Wait for every call asked for, then let the threads go."""
        while self._tails:
            await asyncio.wait(list(self._tails.values()))
        if self._pool is not None:
            self._pool.shutdown(wait=False)  # idle: every call is done
            self._pool = None

    def _chain(self, partition: int, work: Callable[[], Awaitable[T]]) -> asyncio.Task[T]:
        previous = self._tails.get(partition)

        async def after_previous() -> T:
            if previous is not None:
                await asyncio.wait([previous])
            return await work()

        task = asyncio.get_running_loop().create_task(
            after_previous(), name=f"evsched-index-p{partition}"
        )
        self._tails[partition] = task
        task.add_done_callback(functools.partial(self._forget, partition))
        return task

    def _forget(self, partition: int, task: asyncio.Task[Any]) -> None:
        if self._tails.get(partition) is task:
            del self._tails[partition]

    def _thread(self, call: Callable[[], T]) -> Awaitable[T]:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="evsched-index")
        return asyncio.get_running_loop().run_in_executor(self._pool, call)


class Pausing(Protocol):
    """Holds back a partition's fetches and moves its read position (the group consumer)."""

    def pause(self, partition: int) -> None: ...

    def seek(self, partition: int, offset: int) -> None: ...


async def seek_to_index(
    threads: IndexThreads, consumer: Pausing, data_dir: Path, partition: int
) -> PartitionIndex:
    """Pause the partition's fetches, open its index on a thread and seek past it.

    Paused first, before anything awaits: a fetch from the group's committed offset must never
    reach the fold, and the partition stays held back when its index does not open.
    """
    consumer.pause(partition)
    index = await threads.open(data_dir, partition)
    try:
        consumer.seek(partition, index.applied_offset() + 1)
    except BaseException:
        await threads.close(index)  # else its lock stays held and every reopen fails
        raise
    return index
