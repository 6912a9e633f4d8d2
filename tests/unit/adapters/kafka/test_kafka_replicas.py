"""A producer's bounded waits, with no broker (the ack is a future, the cluster a function).

For an ack (adapters.kafka.replicas): one that never comes while the partition lacks replicas
fails at once with the cause named, one that is only slow fails at the timeout, one that comes is
returned. To close (adapters.kafka.clients.stop_producer): records it cannot deliver do not hold it.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from evsched.adapters.kafka.clients import stop_producer
from evsched.adapters.kafka.replicas import PartitionReplicas, ReplicaCheck, acknowledged
from evsched.errors import NotEnoughReplicas, PublishError


def described(
    *, leader: int = 1, isr: tuple[int, ...] = (1, 2, 3), min_isr: int = 2
) -> dict[int, PartitionReplicas]:
    return {
        0: PartitionReplicas(
            topic="ns.events", partition=0, leader=leader, replicas=(1, 2, 3), isr=isr,
            min_isr=min_isr,
        )
    }  # fmt: skip


def test_a_partition_below_min_isr_or_leaderless_is_named() -> None:
    assert described()[0].problem() is None
    short = described(isr=(1,))[0].problem()
    assert short is not None
    assert "partition 0 of 'ns.events' has 1 in-sync replica(s) [1]" in short
    assert "min.insync.replicas=2" in short and "brokers [2, 3]" in short
    leaderless = described(leader=-1)[0].problem()
    assert leaderless is not None and "has no leader" in leaderless


async def test_an_ack_that_comes_is_returned() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.05, future.set_result, 7)

    async def never() -> str | None:
        raise AssertionError("not asked: the ack came before the first check")

    assert await acknowledged(future, what="w", timeout_s=5, problem=never, check_after_s=1) == 7


async def test_a_missing_ack_fails_at_once_when_the_partition_lacks_replicas() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asked: list[int] = []

    async def problem() -> str | None:
        asked.append(1)
        return None if len(asked) < 2 else "partition 0 of 'ns.events' has 1 in-sync replica"

    with pytest.raises(NotEnoughReplicas, match="has 1 in-sync replica; retry once") as caught:
        await acknowledged(future, what="w", timeout_s=30, problem=problem, check_after_s=0.01)
    assert caught.value.retriable and len(asked) == 2
    future.set_exception(RuntimeError("later"))  # retrieved by the abandoned ack's callback
    await asyncio.sleep(0)


async def test_an_ack_abandoned_by_a_cancelled_caller_fails_later_without_a_loop_warning() -> None:
    # The enqueue path bounds its wait from outside too: a cancelled wait must not leave the
    # producer's failure unretrieved ("Task exception was never retrieved" at garbage collection).
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: reported.append(context))
    settle: asyncio.Future[int] = loop.create_future()

    async def ack() -> int:
        return await settle

    async def fine() -> str | None:
        return None

    try:
        waiting = asyncio.ensure_future(
            acknowledged(ack(), what="w", timeout_s=30, problem=fine, check_after_s=5)
        )
        await asyncio.sleep(0.01)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        settle.set_exception(RuntimeError("the broker refused it later"))
        for _ in range(3):
            await asyncio.sleep(0)
        del waiting
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [c for c in reported if "never retrieved" in str(c.get("message"))] == []


async def test_a_slow_ack_fails_at_the_timeout_saying_it_may_still_land() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def fine() -> str | None:
        return None

    with pytest.raises(PublishError, match=r"not acknowledged within 0\.05 s") as caught:
        await acknowledged(future, what="w", timeout_s=0.05, problem=fine, check_after_s=0.01)
    assert not isinstance(caught.value, NotEnoughReplicas)
    assert "may still be written" in str(caught.value)


async def test_a_look_at_the_cluster_that_hangs_does_not_outlast_the_timeout() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def hangs() -> str | None:
        await asyncio.Event().wait()  # the producer's metadata never comes
        return None

    started = asyncio.get_running_loop().time()
    with pytest.raises(PublishError, match=r"not acknowledged within 0\.2 s"):
        await asyncio.wait_for(
            acknowledged(future, what="w", timeout_s=0.2, problem=hangs, check_after_s=0.05), 5
        )
    assert asyncio.get_running_loop().time() - started < 1.0


async def test_the_check_describes_once_for_many_waiters_and_survives_failures() -> None:
    calls: list[str] = []

    async def describe(topic: str) -> dict[int, PartitionReplicas]:
        calls.append(topic)
        await asyncio.sleep(0.01)
        return described(isr=(3,))

    check = ReplicaCheck(describe, fresh_s=60)
    found = await asyncio.gather(*(check.problem("ns.events", 0) for _ in range(20)))
    assert calls == ["ns.events"] and all(f and "[1, 2]" in f for f in found)
    assert await check.problem("ns.events", 5) is None  # a partition it does not know

    async def broken(topic: str) -> dict[int, PartitionReplicas]:
        raise OSError("no broker answers")

    assert await ReplicaCheck(broken).problem("ns.events", 0) is None


class _StuckProducer:
    """A producer whose stop() waits for records it cannot deliver, until they are failed."""

    def __init__(self) -> None:
        self._message_accumulator = self
        self.released = asyncio.Event()
        self.failed: BaseException | None = None

    def fail_all(self, exc: BaseException) -> None:
        self.failed = exc
        self.released.set()

    async def stop(self) -> None:
        await self.released.wait()


async def test_closing_a_producer_holding_undeliverable_records_ends_within_its_timeout() -> None:
    stuck = _StuckProducer()
    await asyncio.wait_for(stop_producer(stuck, timeout_s=0.05), 5)  # type: ignore[arg-type]
    assert "unacknowledged after 0.05 s" in str(stuck.failed)
