"""One transaction per node tick on a real broker: a new owner's read of offsets an open
transaction holds waits for a live member's transaction (which then commits) and fences a
departed member's (which aborts); a zombie's tick, of an older generation, aborts whole."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from tests.conftest import unique_name
from tests.integration.engine import wait_for

from evsched.adapters.kafka.node_transactions import NodeTransactions, committer
from evsched.adapters.kafka.partition_log import GroupMembership
from evsched.adapters.kafka.rdkafka_group import RdkafkaGroupConsumer
from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.errors import Fenced
from evsched.ports import ConsumerOffset, Outgoing
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


class _Holdback:
    def holds(self, entity: str) -> bool:
        return False

    def add(self, entity: str, stage: str, reason: str, *, hold_s: float | None = None) -> None:
        raise AssertionError(f"nothing is held back here: {entity} {reason}")


def _values(bootstrap: str, topic: str, partition: int, isolation: str) -> list[bytes]:
    """Every record value of the partition as a consumer of ``isolation`` reads it."""
    reader = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("reader"),
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    try:
        tp = TopicPartition(topic, partition)
        _, end = reader.get_watermark_offsets(tp, timeout=30, cached=False)
        reader.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        # Past the transactions' markers too: read_committed reaches the end once they ended.
        while reader.position([tp])[0].offset < end:
            assert time.monotonic() < deadline, f"{topic} never read to {end}"
            msg = reader.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value() or b"")
        return values
    finally:
        reader.close()


async def test_a_zombies_tick_aborts_whole_decisions_effects_and_offsets(
    cluster: _Cluster,
) -> None:
    """What a node frozen past its session sends once thawed carries its old generation: the
    coordinator refuses the offsets and none of the tick, records or offsets, becomes visible."""
    topics = cluster.topics
    zombie = await cluster.joined("zombie")
    stale = zombie.group_metadata()  # frozen here
    heir = cluster.consumer("heir")
    await heir.start()
    try:

        async def moved() -> bool:  # the group rebalanced: a newer generation is in force
            await zombie.read_all(0.1, 10)
            await heir.read_all(0.1, 10)
            return zombie.assignment() | heir.assignment() == {0} and bool(heir.assignment())

        await wait_for(moved, what="the heir to own p0", timeout_s=60)
        transactions = NodeTransactions(
            cluster.settings,
            transactional_id=f"{cluster.namespace}.node.zombie",
            client_id="zombie",
            group_metadata=lambda: stale,
        )
        await transactions.start()
        try:
            outgoing = [
                Outgoing(
                    topic=topics.events,
                    key=b"job",
                    value=b"zombie-decision",
                    partition=0,
                    decision="job",
                ),
                Outgoing(topic=topics.effects, key=b"job", value=b"zombie-effect", partition=0),
            ]
            offset = ConsumerOffset(topics.events, 0, 1, topics.node_group)
            with pytest.raises(Fenced):
                await transactions.send(0, outgoing, offset, _Holdback())
        finally:
            await transactions.close()
        # Its records may have reached the log before the abort (read_uncommitted shows them
        # then) or been purged with it: a read_committed consumer sees neither.
        for topic in (topics.events, topics.effects):
            seen = await asyncio.to_thread(_values, cluster.bootstrap, topic, 0, "read_committed")
            assert seen == [], topic
        assert await heir.committed(0) is None  # its offset aborted with them
    finally:
        await heir.close()
        await zombie.close()
