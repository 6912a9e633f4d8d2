"""A node's index threads: blocking index calls run off the event loop, one partition's calls in
the order asked for even when a caller is cancelled, an open nobody waits for any more is closed
again, and a partition that fails to seek after its open releases its index."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from evsched.adapters.index.store import PartitionIndex
from evsched.errors import PartitionRevoked
from evsched.runtime.process.offload import in_turn, made
from evsched.runtime.projection.index_threads import IndexThreads, seek_to_index

T = TypeVar("T")


async def until_set(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 10), "the call never started"


async def test_the_loop_runs_while_a_call_blocks_and_a_cancelled_callers_call_keeps_its_turn() -> (
    None
):
    threads = IndexThreads()
    entered, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        entered.set()
        release.wait(10)
        order.append("first")

    caller = asyncio.create_task(threads.run(0, first))
    await until_set(entered)
    # Another partition's call is not held up by partition 0's, nor is the loop.
    assert await threads.run(1, lambda: "other") == "other"
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    second = asyncio.create_task(threads.run(0, lambda: order.append("second")))
    for _ in range(10):
        await asyncio.sleep(0)
    assert order == [] and not second.done()  # waits for the first, still running
    release.set()
    await second
    assert order == ["first", "second"]
    await threads.stop()


async def test_an_open_whose_caller_was_cancelled_is_closed_again(tmp_path: Path) -> None:
    threads = IndexThreads()
    opening = asyncio.create_task(threads.open(tmp_path, 0))
    await asyncio.sleep(0)  # under way
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    # Had the first handle stayed open, RocksDB would refuse this one its lock.
    index = await threads.open(tmp_path, 0)
    assert index.applied_offset() == -1
    await threads.close(index)
    await threads.stop()
    PartitionIndex(tmp_path / "p0000", 0).close()  # closed on the thread: the lock is free


async def test_what_a_call_made_for_a_caller_cancelled_meanwhile_is_undone() -> None:
    started = asyncio.Event()
    undone: list[str] = []

    async def offload(call: Callable[[], T]) -> T:
        started.set()
        await asyncio.sleep(0)  # the caller is cancelled here, before the call returns
        return call()

    caller = asyncio.create_task(made(offload, lambda: "handle", undone.append))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert undone == ["handle"]
    assert await made(in_turn, lambda: "kept", undone.append) == "kept"
    assert undone == ["handle"]  # a caller that got its result undoes nothing


class RefusingConsumer:
    def __init__(self) -> None:
        self.paused: list[int] = []

    def pause(self, partition: int) -> None:
        self.paused.append(partition)

    def seek(self, partition: int, offset: int) -> None:
        raise PartitionRevoked("not assigned any more")


async def test_an_index_opened_for_a_partition_that_then_fails_to_seek_is_closed(
    tmp_path: Path,
) -> None:
    threads = IndexThreads()
    consumer = RefusingConsumer()
    with pytest.raises(PartitionRevoked):
        await seek_to_index(threads, consumer, tmp_path, 0)
    assert consumer.paused == [0]  # held back even though it did not open
    await threads.stop()
    PartitionIndex(tmp_path / "p0000", 0).close()  # no "LOCK: No locks available"
