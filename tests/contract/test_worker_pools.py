"""The WorkerPools contract: ``testing.MemoryPools`` and ``adapters.kafka.worker_groups``.

What a node's leasing relies on (``runtime.partition.presence``): a namespace without worker
pools tells no queue; a pool's live member tells the queues it holds dispatch partitions of
(once its group is stable; None while it rebalances); a pool whose members all left is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

import pytest

from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed
from evsched.adapters.kafka.topics import Topics
from evsched.adapters.kafka.worker_groups import WorkerGroups
from evsched.errors import BrokerUnavailable
from evsched.ports import WorkerPools
from evsched.settings import Settings
from evsched.testing import MemoryPools
from tests.contract.conftest import eventually

Told = Mapping[str, Mapping[str, int] | None]


class Harness(Protocol):
    @property
    def reader(self) -> WorkerPools:
        """The port under test."""
        ...

    def group(self, pool: str) -> str:
        """The pool's group id: ``<ns>.workers.<pool>``."""
        ...

    async def join(self, pool: str, *queues: str) -> None:
        """A live member of ``pool`` serving ``queues``, until ``leave``."""
        ...

    async def leave(self, pool: str) -> None:
        """Every member of ``pool`` leaves."""
        ...


async def told_when(harness: Harness, want: str, check: Callable[[Told], bool]) -> Told:
    """The first answer ``check`` accepts; failed asks are asked again (a broker's group
    coordinator answers GROUP_COORDINATOR_NOT_AVAILABLE while it loads)."""

    async def attempt() -> Told | None:
        try:
            told = await harness.reader.pools()
        except BrokerUnavailable:
            return None
        return told if check(told) else None

    return await eventually(attempt, want)


class WorkerPoolsContract:
    async def test_a_namespace_without_pools_tells_no_queue(self, harness: Harness) -> None:
        assert await told_when(harness, "an answer", lambda _: True) == {}

    async def test_a_member_tells_the_queues_it_serves_and_a_pool_left_is_gone(
        self, harness: Harness
    ) -> None:
        group = harness.group("mail")
        await harness.join("mail", "default")
        told = await told_when(harness, "the pool to be stable", lambda t: t.get(group) is not None)
        assert told == {group: {"default": 1}}
        await harness.leave("mail")
        await told_when(harness, "the pool to be gone", lambda t: group not in t)


class MemoryHarness:
    def __init__(self) -> None:
        self.reader = MemoryPools()

    def group(self, pool: str) -> str:
        return f"ns.workers.{pool}"

    async def join(self, pool: str, *queues: str) -> None:
        self.reader.serve(self.group(pool), *queues)

    async def leave(self, pool: str) -> None:
        self.reader.leave(self.group(pool))


class TestMemoryPools(WorkerPoolsContract):
    @pytest.fixture
    def harness(self) -> Harness:
        return MemoryHarness()


class KafkaHarness:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.reader = WorkerGroups(settings)
        self._members: dict[str, tuple[KafkaDispatchFeed, asyncio.Task[None]]] = {}

    def group(self, pool: str) -> str:
        return f"{self.settings.namespace}.workers.{pool}"

    async def join(self, pool: str, *queues: str) -> None:
        topics = [Topics(self.settings.namespace).dispatch(q) for q in queues]
        feed = KafkaDispatchFeed.for_pool(
            self.settings, topics, group_id=self.group(pool), client_id=f"contract-{pool}"
        )
        await feed.start()

        async def poll() -> None:  # a worker polls while it lives, full or not
            while True:
                await feed.take(0, 0.1)
                await asyncio.sleep(0.1)

        self._members[pool] = (feed, asyncio.create_task(poll()))

    async def leave(self, pool: str) -> None:
        feed, polling = self._members.pop(pool)
        polling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await polling
        await feed.close()

    async def close(self) -> None:
        for pool in list(self._members):
            await self.leave(pool)
        await self.reader.close()


@pytest.mark.broker
class TestKafkaWorkerGroups(WorkerPoolsContract):
    @pytest.fixture
    async def harness(self, settings: Settings) -> AsyncIterator[Harness]:
        harness = KafkaHarness(settings)
        try:
            yield harness
        finally:
            await harness.close()
