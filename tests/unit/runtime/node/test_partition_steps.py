"""A partition's task steps at most once per ``step_interval_ms``: records arriving meanwhile
gather into the next step, every record is stepped once, and an idle partition steps at once."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import structlog

from evsched.ports import Record
from evsched.runtime.node.health import NodeHealth
from evsched.runtime.node.steps import PartitionSteps
from evsched.runtime.partition.runner import PartitionRunner

PARTITION = 2


class Owner:
    """Stands in for an OwnedPartition: remembers when each step began and what it took."""

    partition = PARTITION
    resume_offset = 0
    instruments = None
    caught_up = True

    def __init__(self) -> None:
        self.steps: list[tuple[float, list[int]]] = []

    def next_wake_at(self) -> int | None:
        return None

    def has_work(self, records: list[Record], now: int) -> bool:
        return bool(records)

    async def step(self, records: list[Record], now: int, position: int) -> None:
        self.steps.append((time.monotonic(), [r.offset for r in records]))


class Consumer:
    def pause(self, partition: int) -> None: ...

    def resume(self, partition: int) -> None: ...

    async def position(self, partition: int) -> int:
        return 0


def steps(interval_ms: int) -> PartitionSteps:
    unused: Any = None
    return PartitionSteps(
        restores=unused,
        health=NodeHealth(),
        ownership=unused,
        max_records=2_000,
        max_idle_ms=200,
        step_interval_ms=interval_ms,
        dropped=None,
        drop=unused,
        logger=structlog.get_logger("test"),
    )


def record(offset: int) -> Record:
    return Record("ns.events", PARTITION, offset, 0, b"k", b"v")


async def feed_and_step(interval_ms: int, count: int, every_s: float) -> tuple[Owner, float]:
    """Feed ``count`` records ``every_s`` apart; the owner, and when the first was fed."""
    owner, consumer = Owner(), Consumer()
    runner = PartitionRunner(owner, consumer)  # type: ignore[arg-type]
    task = asyncio.create_task(steps(interval_ms).run(consumer, runner))  # type: ignore[arg-type]
    first_fed = time.monotonic()
    for offset in range(count):
        runner.feed([record(offset)])
        await asyncio.sleep(every_s)

    async def all_stepped() -> None:
        while sum(len(taken) for _, taken in owner.steps) < count:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(all_stepped(), 10)
    runner.close()
    await asyncio.wait_for(task, 5)
    return owner, first_fed


def test_steps_are_spaced_by_the_interval_and_every_record_is_stepped_once() -> None:
    owner, _ = asyncio.run(feed_and_step(interval_ms=100, count=60, every_s=0.005))
    taken = [offset for _, offsets in owner.steps for offset in offsets]
    assert taken == list(range(60))
    begun = [at for at, _ in owner.steps]
    gaps = [later - earlier for earlier, later in itertools.pairwise(begun)]
    assert gaps and min(gaps) >= 0.099
    # 60 records over at least 0.3 s: a step each time records came would be dozens.
    assert len(owner.steps) <= 1 + (begun[-1] - begun[0]) / 0.099


def test_an_idle_partition_steps_at_once() -> None:
    owner, first_fed = asyncio.run(feed_and_step(interval_ms=1_000, count=1, every_s=0))
    [(began, offsets)] = owner.steps
    assert offsets == [0]
    assert began - first_fed < 0.5  # not held back by the 1 s interval: nothing stepped before
