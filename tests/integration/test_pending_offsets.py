"""A new owner's read of offsets an open transaction holds, on a real broker: it waits for a
live member's transaction (which then commits) and fences a departed member's (which aborts)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from tests.conftest import unique_name
from tests.integration.engine import wait_for

from evsched.adapters.kafka.node_transactions import NodeTransactions, committer
from evsched.adapters.kafka.partition_log import GroupMembership
from evsched.adapters.kafka.rdkafka_group import RdkafkaGroupConsumer
from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.asyncio]

# Far above the test: only a fence, never the broker's timeout, ends these transactions.
HELD_TRANSACTION_MS = 120_000


class _Quiet:
    async def revoked(self, partitions: list[int]) -> None:
        pass

    async def assigned(self, partitions: list[int]) -> None:
        pass


class _Cluster:
    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.namespace = unique_name("pending")
        self.topics = Topics(self.namespace)
        self.settings = Settings(bootstrap=bootstrap, namespace=self.namespace, event_partitions=1)
        self.producers: list[Producer] = []

    def consumer(self, name: str) -> RdkafkaGroupConsumer:
        member = GroupMembership(
            settings=self.settings,
            topic=self.topics.events,
            group_id=self.topics.node_group,
            client_id=f"evsched-node-{name}",
            max_records=10,
        )
        return RdkafkaGroupConsumer(member, listener=_Quiet())

    async def joined(self, name: str) -> RdkafkaGroupConsumer:
        consumer = self.consumer(name)
        await consumer.start()

        async def assigned() -> bool:
            await consumer.read_all(0.1, 10)
            return consumer.assignment() == {0} and consumer.member_id() is not None

        await wait_for(assigned, what=f"{name} to own p0", timeout_s=60)
        return consumer

    def producer(self, transactional_id: str) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": transactional_id,
                "transaction.timeout.ms": HELD_TRANSACTION_MS,
            }
        )
        self.producers.append(producer)
        producer.init_transactions(30)
        return producer

    def offsets(
        self, producer: Producer, member: RdkafkaGroupConsumer, tx: str, offset: int
    ) -> None:
        """Begin a transaction holding p0's offset, as a node's tick does (not committed)."""
        producer.begin_transaction()
        tp = TopicPartition(
            self.topics.events, 0, offset, metadata=committer(tx, member.member_id())
        )
        producer.send_offsets_to_transaction([tp], member.group_metadata(), 30)

    def fencer(self, fenced: list[str]) -> Callable[[str], Awaitable[None]]:
        transactions = NodeTransactions(
            self.settings,
            transactional_id=f"{self.namespace}.node.heir",
            client_id="heir",
            group_metadata=None,
        )

        async def fence(transactional_id: str) -> None:
            fenced.append(transactional_id)
            await transactions.fence(transactional_id)

        return fence


@pytest.fixture
async def cluster(kafka_bootstrap: str) -> AsyncIterator[_Cluster]:
    found = _Cluster(kafka_bootstrap)
    await ensure_topics(kafka_bootstrap, found.namespace, event_partitions=1, queues=())
    try:
        yield found
    finally:
        for producer in found.producers:
            with contextlib.suppress(KafkaException):  # a fenced one's close says so
                producer.close()


async def test_a_live_members_open_transaction_is_waited_for_and_commits(
    cluster: _Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    tx = f"{cluster.namespace}.node.live"
    live = await cluster.joined("live")
    producer = cluster.producer(tx)
    heir = cluster.consumer("heir")  # reads offsets without joining
    fenced: list[str] = []
    heir.fence = cluster.fencer(fenced)
    asked = asyncio.Event()
    members = heir._members.ids

    async def members_asked() -> set[str]:
        found = await members()
        asked.set()
        return found

    monkeypatch.setattr(heir._members, "ids", members_asked)
    try:
        cluster.offsets(producer, live, tx, 3)
        producer.commit_transaction(30)
        cluster.offsets(producer, live, tx, 5)  # the live node is mid-commit
        read = asyncio.create_task(heir.committed(0))
        await asyncio.wait_for(asked.wait(), 30)  # the read found p0 held, and asked who by
        assert not read.done()
        await asyncio.to_thread(producer.commit_transaction, 30)  # not fenced: it commits
        assert await asyncio.wait_for(read, 30) == 5
        assert fenced == []
    finally:
        await heir.close()
        await live.close()


async def test_a_departed_members_open_transaction_is_fenced(cluster: _Cluster) -> None:
    tx = f"{cluster.namespace}.node.gone"
    gone = await cluster.joined("gone")
    producer = cluster.producer(tx)
    cluster.offsets(producer, gone, tx, 3)
    producer.commit_transaction(30)
    cluster.offsets(producer, gone, tx, 5)
    await gone.close()  # it left the group (a frozen node is expelled) with p0's offset held
    heir = cluster.consumer("heir")
    fenced: list[str] = []
    heir.fence = cluster.fencer(fenced)
    try:
        started = time.monotonic()
        assert await heir.committed(0) == 3  # what the open transaction held was aborted
        assert time.monotonic() - started < HELD_TRANSACTION_MS / 1000 / 4
        assert fenced == [tx]
        with pytest.raises(KafkaException) as raised:
            await asyncio.to_thread(producer.commit_transaction, 30)
        assert raised.value.args[0].fatal() or "fenced" in str(raised.value).lower()
    finally:
        await heir.close()
