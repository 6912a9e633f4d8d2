"""The node's per-partition inbox: records in offset order, each once; a backlog pauses the
partition's fetches and draining resumes them; a waiting runner wakes for records and for close."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.structs import TopicPartition

from evsched.ports import Record
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.partition.runner import PartitionRunner
from evsched.testing import NodeDriver

TP = TopicPartition("ns.events", 3)


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[OwnedPartition]:
    """A real partition of ``ns.events`` whose index holds offsets 0 to 9: it resumes at 10."""
    driver = NodeDriver(tmp_path, partition=TP.partition, namespace="ns")
    for offset in range(10):
        driver.append_raw(b"not an event", key=str(offset).encode())
    asyncio.run(driver.step())
    assert driver.owner.resume_offset == 10
    yield driver.owner
    driver.close()


class Consumer:
    """Records pause and resume calls, as the real consumer's subscription state would."""

    def __init__(self) -> None:
        self.paused: set[int] = set()
        self.calls: list[str] = []

    def pause(self, partition: int) -> None:
        self.paused.add(partition)
        self.calls.append("pause")

    def resume(self, partition: int) -> None:
        self.paused.discard(partition)
        self.calls.append("resume")


def records(first: int, count: int) -> list[Record]:
    return [Record(TP.topic, TP.partition, o, 0, b"k", b"v") for o in range(first, first + count)]


def runner(owner: OwnedPartition, backlog: int = 8) -> tuple[PartitionRunner, Consumer]:
    consumer = Consumer()
    return PartitionRunner(owner, consumer, backlog=backlog), consumer


def offsets(rs: list[Record]) -> list[int]:
    return [r.offset for r in rs]


def test_records_come_out_in_order_once_from_the_resume_offset(owner: OwnedPartition) -> None:
    r, _ = runner(owner)
    r.feed(records(8, 4))  # 8 and 9 are below the index's resume offset
    r.feed(records(11, 3))  # 11 was fed already
    assert offsets(r.take(3)) == [10, 11, 12]
    assert offsets(r.take(10)) == [13]
    assert r.take(10) == []
    assert r.fetched_to == 14


def test_a_backlog_pauses_fetching_and_draining_below_half_resumes_it(
    owner: OwnedPartition,
) -> None:
    r, consumer = runner(owner, backlog=8)
    r.feed(records(10, 7))
    assert consumer.paused == set()
    r.feed(records(17, 1))
    assert consumer.paused == {TP.partition}
    r.take(3)  # 5 left: not below half yet
    assert consumer.paused == {TP.partition}
    r.take(2)
    assert consumer.paused == set()
    assert consumer.calls == ["pause", "resume"]


def test_a_closed_runner_takes_no_more_records_and_never_resumes(owner: OwnedPartition) -> None:
    r, consumer = runner(owner, backlog=2)
    r.feed(records(10, 2))
    r.close()
    r.feed(records(12, 2))
    assert offsets(r.take(10)) == [10, 11]
    assert consumer.calls == ["pause"]


def test_wait_returns_on_records_on_close_and_on_timeout(owner: OwnedPartition) -> None:
    async def scenario() -> list[str]:
        r, _ = runner(owner)
        seen: list[str] = []
        loop = asyncio.get_running_loop()

        async def waits(label: str, timeout_s: float) -> None:
            await r.wait(timeout_s)
            seen.append(label)

        waiter = asyncio.create_task(waits("records", 30))
        await asyncio.sleep(0)
        loop.call_soon(r.feed, records(10, 1))
        await asyncio.wait_for(waiter, 5)
        r.take(10)
        await asyncio.wait_for(waits("timeout", 0.01), 5)
        waiter = asyncio.create_task(waits("close", 30))
        await asyncio.sleep(0)
        r.close()
        await asyncio.wait_for(waiter, 5)
        return seen

    assert asyncio.run(scenario()) == ["records", "timeout", "close"]
