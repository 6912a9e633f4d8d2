"""A long catch-up lets the event loop run (issue 9, the take-over stall): a partition folds a
gap and a tail of thousands of records, and a changelog restore loads a snapshot, in chunks that
yield between them, and each ends exactly where one fold (one load) of the same records ends."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.topics import Topics
from evsched.core.events import Event
from evsched.core.planner import PlannerBudgets
from evsched.ports import Record
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.projection import changelog, fold_chunks
from evsched.runtime.projection.changelog import restore_into
from evsched.runtime.projection.changelog_restore import restore_partition
from evsched.runtime.projection.index_threads import IndexThreads
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import index_path, restore
from evsched.testing import (
    FrozenClock,
    MemoryBroker,
    MemoryOutbox,
    MemoryPartitionLog,
    NodeDriver,
)
from evsched.testing.driver import every_queue_declared
from tests.unit.node_driver_events import enqueued

T = TypeVar("T")

JOBS = 3_000
BUDGETS = PlannerBudgets(dispatch_timeout_ms=30_000)
ONE_GO = 10**9  # a chunk larger than any run of records: the fold as it was, in one go


class Ticker:
    """A task that counts its turns on the event loop while ``ticking``."""

    def __init__(self) -> None:
        self.ticks = 0

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)

    @contextlib.asynccontextmanager
    async def ticking(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self._run())
        await asyncio.sleep(0)  # it has started
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def during(self, work: Awaitable[T]) -> tuple[T, int]:
        """What ``work`` returns, and how many turns the ticker got while it ran."""
        async with self.ticking():
            before = self.ticks
            result = await work
            return result, self.ticks - before


def jobs(count: int = JOBS) -> list[Event]:
    return [enqueued(f"job-{n:05d}") for n in range(count)]


def driver_over(directory: Path, events: list[Event]) -> NodeDriver:
    """A partition whose log holds ``events``, fetched in one step, not folded yet."""
    driver = NodeDriver(directory, budgets=BUDGETS, max_records=len(events) + 1)
    driver.append(*events)
    return driver


def sent(driver: NodeDriver) -> list[tuple[str, bytes | None, bytes | None]]:
    return [(r.topic, r.key, r.value) for r in driver.sent()]


async def test_a_long_catch_up_lets_other_tasks_run_and_folds_what_one_fold_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = jobs()
    chunked, whole = driver_over(tmp_path / "a", events), driver_over(tmp_path / "b", events)
    try:
        _, turns = await Ticker().during(chunked.step())
        # The step folded JOBS records: the loop ran between every chunk of them.
        assert turns >= JOBS // fold_chunks.FOLD_CHUNK_RECORDS - 1
        monkeypatch.setattr(fold_chunks, "FOLD_CHUNK_RECORDS", ONE_GO)
        _, turns_whole = await Ticker().during(whole.step())
        assert turns_whole == 0  # what the chunks change: nothing else in a step yields
        assert chunked.owner.index.applied_offset() == JOBS - 1
        assert chunked.owner.index.digest() == whole.owner.index.digest()
        assert sent(chunked) == sent(whole)  # the same leases, dispatch records and changelog
        await chunked.settle()
        await whole.settle()
        assert chunked.owner.index.digest() == whole.owner.index.digest()
    finally:
        chunked.close()
        whole.close()


async def gap_owner(directory: Path, records: list[Record]) -> OwnedPartition:
    """A new owner whose index is empty and whose group offset is past ``records``: all gap."""
    box = MemoryOutbox(MemoryBroker(FrozenClock()))
    await box.start()
    return OwnedPartition(
        index=PartitionIndex(directory, 0),
        topics=Topics("ns"),
        outbox=box,
        clock=box.broker.clock,
        group_id="ns.nodes",
        node_id="n1",
        budgets=BUDGETS,
        committed=len(records),
        end_offset=len(records),
        ensure_queues=every_queue_declared,
    )


async def test_a_gap_below_the_group_offset_is_refolded_in_chunks(tmp_path: Path) -> None:
    source = driver_over(tmp_path / "log", jobs())
    records = source.log()
    owner = await gap_owner(tmp_path / "gap", records)
    reference = Projector(PartitionIndex(tmp_path / "one-go", 0))
    try:
        _, turns = await Ticker().during(owner.step(records, 0, len(records)))
        assert turns >= JOBS // fold_chunks.FOLD_CHUNK_RECORDS - 1
        reference.commit(reference.fold(records))
        assert owner.index.applied_offset() == JOBS - 1
        assert owner.index.digest() == reference.index.digest()
    finally:
        owner.close()
        reference.index.close()
        source.close()


async def test_a_rebuild_reads_and_folds_in_chunks_to_what_one_fold_gives(tmp_path: Path) -> None:
    source = driver_over(tmp_path / "log", jobs())
    log = MemoryPartitionLog()
    for record in source.log():
        log.append(0, record.value, key=record.key, log_at=record.log_at)
    await log.start()
    rebuilt = Projector(PartitionIndex(tmp_path / "rebuilt", 0))
    reference = Projector(PartitionIndex(tmp_path / "one-go", 0))
    try:
        folded, turns = await Ticker().during(restore(log, {0: rebuilt}))
        assert folded == JOBS
        assert turns >= JOBS // fold_chunks.FOLD_CHUNK_RECORDS - 1  # one read, which yields once
        reference.commit(reference.fold(source.log()))
        assert rebuilt.index.digest() == reference.index.digest()
    finally:
        rebuilt.index.close()
        reference.index.close()
        source.close()


async def settled_node(directory: Path) -> NodeDriver:
    """A partition that folded JOBS enqueues and leased what its budgets let it."""
    driver = driver_over(directory, jobs())
    await driver.settle()
    return driver


async def test_a_changelog_restore_loads_in_chunks_and_equals_one_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = await settled_node(tmp_path / "node")
    state = node.broker.reader(node.topics.state)
    assert len(node.changelog()) > JOBS  # a snapshot of thousands of records
    chunked = PartitionIndex(tmp_path / "chunked", 0)
    whole = PartitionIndex(tmp_path / "whole", 0)
    try:
        monkeypatch.setattr(changelog, "LOAD_CHUNK_RECORDS", 100)
        meta, turns = await Ticker().during(restore_into(state, 0, chunked))
        assert meta is not None and meta.applied_offset == node.owner.index.applied_offset()
        assert turns >= len(node.changelog()) // 100
        monkeypatch.setattr(changelog, "LOAD_CHUNK_RECORDS", ONE_GO)
        assert await restore_into(state, 0, whole) == meta
        assert chunked.digest() == whole.digest() == node.owner.index.digest()
    finally:
        chunked.close()
        whole.close()
        node.close()


async def test_a_node_restores_a_partition_on_its_index_threads(tmp_path: Path) -> None:
    node = await settled_node(tmp_path / "node")
    threads = IndexThreads()
    data_dir = tmp_path / "heir"
    on: list[str] = []  # the thread of every blocking call

    def recorded(call: Callable[[], T]) -> Awaitable[T]:
        def named() -> T:
            on.append(threading.current_thread().name)
            return call()

        return threads.run(0, named)

    try:
        state = node.broker.reader(node.topics.state)
        meta = await restore_partition(state, data_dir, 0, log_start=0, offload=recorded)
        # The scratch index's open, its loads, its derived families, its close, the swap.
        assert len(on) >= 5 and all(name.startswith("evsched-index") for name in on)
        restored = await threads.open(data_dir, 0)
        assert index_path(data_dir, 0) == restored.path
        assert meta.applied_offset == restored.applied_offset()
        assert restored.digest() == node.owner.index.digest()
        await threads.close(restored)
    finally:
        await threads.stop()
        node.close()
