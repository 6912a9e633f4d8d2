"""Partitions sharing one transaction per node tick (``node_transactions``), without a broker: a
failed tick fails each of its partitions' steps and nothing of it reaches an index; each reopens
from its own index, refolds only that step's records and sends each effect once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from evsched.adapters.kafka.node_transactions import NodeTransactions
from evsched.core.events import Effect, JobLeased
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status
from evsched.errors import BrokerUnavailable
from evsched.settings import Settings
from evsched.testing import MemoryBroker, NodeDriver
from evsched.testing.memory import FrozenClock
from tests.unit.node_driver_events import enqueued, started, succeeded

LONG_LEASES = PlannerBudgets(dispatch_timeout_ms=600_000)
TRANSACTIONAL_ID = "ns.node.n"


class _Tick:
    """The node's transactions committing into a MemoryBroker, one tick failing on demand."""

    def __init__(self, broker: MemoryBroker, monkeypatch: pytest.MonkeyPatch) -> None:
        self.broker = broker
        self.epoch = broker.claim(TRANSACTIONAL_ID)
        self.fail_next = False
        self.ticks: list[list[int]] = []  # the partitions of each tick tried
        self.transactions = NodeTransactions(
            Settings(namespace="ns"),
            transactional_id=TRANSACTIONAL_ID,
            client_id="n",
            group_metadata=None,
        )

        async def no_metadata(sends: Sequence[Any]) -> None:
            return None

        monkeypatch.setattr(self.transactions, "_transact", self._transact)
        monkeypatch.setattr(self.transactions, "_hold_without_metadata", no_metadata)
        # Started without a broker: a producer stand-in and the wake-up; the committer task is
        # started by ``commit`` (so a test can queue several partitions' sends for one tick).
        self.transactions._producer = object()  # type: ignore[assignment]
        self.transactions._wake = asyncio.Event()

    def _transact(self, sends: Sequence[Any]) -> None:
        self.ticks.append(sorted(s.partition for s in sends))
        if self.fail_next:  # e.g. an abortable error on one send: the whole tick aborts
            self.fail_next = False
            raise BrokerUnavailable("injected: the tick's transaction aborted")
        for s in sends:  # one commit: each send's records with its offset, or none
            self.broker.commit(TRANSACTIONAL_ID, self.epoch, s.records, s.offset)

    def commit(self) -> None:
        if self.transactions._task is None:
            self.transactions._task = asyncio.create_task(self.transactions._commits())

    async def queued(self, count: int) -> None:
        while len(self.transactions._queue) < count:
            await asyncio.sleep(0)

    def attach(self, driver: NodeDriver) -> None:
        driver.outbox = self.transactions.for_partition(driver.partition)  # type: ignore[assignment]


@pytest.fixture
def drivers(tmp_path: Path) -> Iterator[tuple[NodeDriver, NodeDriver]]:
    broker = MemoryBroker(FrozenClock())
    pair = tuple(
        NodeDriver(tmp_path / f"n{p}", partition=p, budgets=LONG_LEASES, broker=broker)
        for p in (0, 1)
    )
    yield pair  # type: ignore[misc]
    for driver in pair:
        driver.close()


async def test_a_failed_tick_fails_each_partition_in_it_and_reopens_refold_only_that_step(
    drivers: tuple[NodeDriver, NodeDriver], monkeypatch: pytest.MonkeyPatch
) -> None:
    first = drivers[0]
    tick = _Tick(first.broker, monkeypatch)
    tick.commit()
    for driver in drivers:
        tick.attach(driver)
        driver.append(enqueued(f"job-{driver.partition}"))
        await driver.settle()
    # One broker: every driver sees both partitions' dispatches.
    dispatches = {int(d.job_id[-1]): d for d in first.dispatched()}
    assert sorted(d.job_id for d in dispatches.values()) == ["job-0", "job-1"]
    applied = {d.partition: d.owner.index.applied_offset() for d in drivers}
    effects_before = len(first.effects())
    for driver in drivers:
        dispatch = dispatches[driver.partition]
        driver.append(started(dispatch), succeeded(dispatch, Effect(kind="k", payload=b"x")))

    # Both partitions' steps go into one tick (the committer starts once both are queued).
    await tick.transactions.close()
    tick.transactions._producer = object()  # type: ignore[assignment]
    tick.transactions._task = None
    tick.fail_next = True
    steps = [asyncio.create_task(d.step()) for d in drivers]
    await tick.queued(2)
    tick.commit()
    failed = await asyncio.gather(*steps, return_exceptions=True)
    assert [type(f) for f in failed] == [BrokerUnavailable, BrokerUnavailable]
    assert tick.ticks[-1] == [0, 1]
    assert len(first.effects()) == effects_before  # nothing of the tick landed
    for driver in drivers:
        assert driver.owner.index.applied_offset() == applied[driver.partition]

    # What the node does (runtime.node.steps): drop each partition, reopen it from its index.
    for driver in drivers:
        driver.close()
        tick.attach(driver)
        owner = await driver.open()
        # Bounded: only the failed step's records (start and success) are folded again.
        assert owner.resume_offset == applied[driver.partition] + 1
        assert len([r for r in driver.log() if r.offset >= owner.resume_offset]) == 2
        await driver.settle()
        assert owner.stats["records"] == 2
    assert len(first.effects()) == effects_before + 2  # each success's effect, once
    for driver in drivers:
        state = driver.job(f"job-{driver.partition}")
        assert state is not None and state.status is Status.SUCCEEDED
    # The shared broker's transactions: each job leased once, by either partition's fold.
    assert sorted(e.job_id for e in first.decisions(JobLeased)) == ["job-0", "job-1"]
    await tick.transactions.close()
