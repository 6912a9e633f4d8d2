"""The PartitionOutbox contract, for the twin (``MemoryOutbox``) and Kafka, a producer per partition
(``KafkaOutbox``) or a share of the node's transactions (``PartitionSender``), alike:
records and the consumer offset become visible to a read_committed reader together, only once
committed; a fenced outbox raises ``Fenced`` and commits nothing; order per key holds; a refused
record holds back its own decision only, and a refused effect fails the send whole."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import TopicPartition

from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.node_transactions import NodeTransactions
from evsched.adapters.kafka.partition_outbox import KafkaOutbox
from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.errors import Fenced, RecordRefused
from evsched.ports import ConsumerOffset, Outgoing, PartitionOutbox
from evsched.settings import Settings
from evsched.testing import MemoryBroker, MemoryOutbox
from tests.conftest import unique_name

# The largest record the "small" queue's topic takes (its max.message.bytes).
SMALL_BYTES = 1_024
DEADLINE_S = 30.0


@dataclass
class Holds:
    """A Holdback that remembers what it was told to hold, and why."""

    held: dict[str, str] = field(default_factory=dict)

    def holds(self, entity: str) -> bool:
        return entity in self.held

    def add(
        self,
        entity: str,
        stage: str,
        reason: str,
        *,
        hold_s: float | None = None,
        quiet: bool = False,
    ) -> None:
        self.held[entity] = stage


class MemoryKit:
    """The twin: a MemoryBroker whose small topic refuses records over SMALL_BYTES."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self.broker = MemoryBroker(max_message_bytes={topics.dispatch("small"): SMALL_BYTES})

    async def outbox(self, transactional_id: str) -> PartitionOutbox:
        box = MemoryOutbox(self.broker, transactional_id)
        await box.start()
        return box

    async def visible(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        return [(r.key, r.value) for r in self.broker.records(topic)]

    async def committed(self, group_id: str, topic: str) -> int | None:
        return self.broker.committed(group_id, topic)

    async def close(self) -> None:
        return None


class KafkaKit:
    """The real broker: one-partition topics, the small one with max.message.bytes set."""

    def __init__(self, settings: Settings, *, tick: bool) -> None:
        self.settings = settings
        self.topics = Topics(settings.namespace)
        self.tick = tick  # the node's shared transactions, or a producer per partition
        self.started: list[NodeTransactions | KafkaOutbox] = []

    async def create_topics(self) -> None:
        ns = self.settings.namespace
        await ensure_topics(self.settings.bootstrap, ns, event_partitions=1, queues=["default"])
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.bootstrap)
        await admin.start()
        try:
            small = {"max.message.bytes": str(SMALL_BYTES)}
            topic = NewTopic(self.topics.dispatch("small"), 1, 1, topic_configs=small)
            await admin.create_topics([topic])
        finally:
            await admin.close()

    async def outbox(self, transactional_id: str) -> PartitionOutbox:
        box: PartitionOutbox
        if self.tick:
            node = NodeTransactions(
                self.settings,
                transactional_id=transactional_id,
                client_id="contract",
                group_metadata=None,
            )
            self.started.append(node)
            box = node.for_partition(0)
        else:
            own = KafkaOutbox(
                self.settings, transactional_id=transactional_id, client_id="contract"
            )
            self.started.append(own)
            box = own
        await box.start()
        return box

    async def visible(self, topic: str) -> list[tuple[bytes | None, bytes | None]]:
        """Everything a read_committed consumer reads, up to the last stable offset."""
        consumer = kafka.consumer(self.settings, group_id=None)
        tp = TopicPartition(topic, 0)
        await consumer.start()
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            end = (await consumer.end_offsets([tp]))[tp]
            seen: list[tuple[bytes | None, bytes | None]] = []
            deadline = time.monotonic() + DEADLINE_S
            while await consumer.position(tp) < end:
                assert time.monotonic() < deadline, f"{topic} not read to {end} in time"
                batch = await consumer.getmany(tp, timeout_ms=200)
                seen += [(r.key, r.value) for r in batch.get(tp, [])]
            return seen
        finally:
            await consumer.stop()

    async def committed(self, group_id: str, topic: str) -> int | None:
        consumer = kafka.consumer(self.settings, group_id=group_id)
        await consumer.start()
        try:
            offset: int | None = await consumer.committed(TopicPartition(topic, 0))
            return offset
        finally:
            await consumer.stop()

    async def close(self) -> None:
        for box in self.started:
            await box.close()
        admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.bootstrap)
        await admin.start()
        try:
            prefix = f"{self.settings.namespace}."
            ours = [t for t in await admin.list_topics() if t.startswith(prefix)]
            if ours:
                await admin.delete_topics(ours)
        finally:
            await admin.close()


Kit = MemoryKit | KafkaKit


@pytest.fixture(
    params=[
        "memory",
        pytest.param("kafka", marks=pytest.mark.broker),
        pytest.param("kafka-tick", marks=pytest.mark.broker),
    ]
)
async def kit(request: pytest.FixtureRequest) -> AsyncIterator[Kit]:
    made: Kit
    if request.param == "memory":
        made = MemoryKit(Topics(unique_name("t")))
    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        namespace = unique_name("t")
        settings = Settings(bootstrap=bootstrap, namespace=namespace, event_partitions=1)
        made = KafkaKit(settings, tick=request.param == "kafka-tick")
        await made.create_topics()
    try:
        yield made
    finally:
        await made.close()


def event(topic: str, key: str, value: bytes, decision: str | None = None) -> Outgoing:
    return Outgoing(topic=topic, key=key.encode(), value=value, partition=0, decision=decision)


def lease(kit: Kit, job: str, *, queue: str = "default", size: int = 16) -> list[Outgoing]:
    """A decision's records: its dispatch record first, then its event."""
    dispatch = Outgoing(
        topic=kit.topics.dispatch(queue), key=job.encode(), value=b"d" * size, queue=queue,
        decision=job,
    )  # fmt: skip
    return [dispatch, event(kit.topics.events, job, f"leased {job}".encode(), job)]


def values(seen: Sequence[tuple[bytes | None, bytes | None]]) -> list[bytes]:
    return [v or b"" for _, v in seen]


async def test_records_and_offset_become_visible_together_once_committed(kit: Kit) -> None:
    events, effects = kit.topics.events, kit.topics.effects
    assert await kit.visible(events) == [] and await kit.committed("g", events) is None
    box = await kit.outbox("tx-0")
    offset = ConsumerOffset(events, 0, 7, "g")
    effect = Outgoing(topic=effects, key=b"j", value=b"effect", headers=(("h", b"1"),))
    sent = await box.send([*lease(kit, "j"), effect], offset=offset, holdback=Holds())
    assert len(sent) == 3
    assert values(await kit.visible(events)) == [b"leased j"]
    assert values(await kit.visible(kit.topics.dispatch("default"))) == [b"d" * 16]
    assert await kit.visible(effects) == [(b"j", b"effect")]
    assert await kit.committed("g", events) == 7
    # An offset alone is a transaction too.
    await box.send([], offset=ConsumerOffset(events, 0, 9, "g"), holdback=Holds())
    assert await kit.committed("g", events) == 9


async def test_order_per_key_is_preserved_across_transactions(kit: Kit) -> None:
    box = await kit.outbox("tx-0")
    topic = kit.topics.events
    for batch in range(3):
        records = [event(topic, f"k{i % 2}", f"{batch}-{i}".encode()) for i in range(4)]
        await box.send(records, offset=None, holdback=Holds())
    seen = await kit.visible(topic)
    for key in (b"k0", b"k1"):
        mine = [v for k, v in seen if k == key]
        first = 0 if key == b"k0" else 1
        assert mine == [f"{b}-{i}".encode() for b in range(3) for i in (first, first + 2)]


async def test_a_step_larger_than_a_produce_batch_commits_whole_and_in_order(kit: Kit) -> None:
    # About 1.2 MB to one partition: more than one of the producer's batches (BATCH_BYTES).
    box = await kit.outbox("tx-0")
    topic = kit.topics.events
    records = [event(topic, f"k{i}", f"{i:06d}".encode() * 50) for i in range(4_000)]
    offset = ConsumerOffset(topic, 0, 5, "g")
    sent = await box.send(records, offset=offset, holdback=Holds())
    assert len(sent) == len(records)
    assert values(await kit.visible(topic)) == [o.value for o in records]
    assert await kit.committed("g", topic) == 5


async def test_a_fenced_outbox_raises_fenced_and_its_transaction_is_never_visible(
    kit: Kit,
) -> None:
    events = kit.topics.events
    zombie = await kit.outbox("tx-0")
    await zombie.send([event(events, "a", b"before")], offset=None, holdback=Holds())
    successor = await kit.outbox("tx-0")  # a new owner of the partition
    with pytest.raises(Fenced):
        await zombie.send(
            [event(events, "a", b"from zombie")],
            offset=ConsumerOffset(events, 0, 5, "g"),
            holdback=Holds(),
        )
    await successor.send([event(events, "a", b"from successor")], offset=None, holdback=Holds())
    assert values(await kit.visible(events)) == [b"before", b"from successor"]
    assert await kit.committed("g", events) is None


async def test_a_refused_record_holds_back_its_decision_only_and_the_rest_commits(
    kit: Kit,
) -> None:
    events = kit.topics.events
    holds = Holds()
    box = await kit.outbox("tx-0")
    records = [
        *lease(kit, "a"),
        *lease(kit, "big", queue="small", size=4 * SMALL_BYTES),
        *lease(kit, "c", queue="small"),
    ]
    offset = ConsumerOffset(events, 0, 3, "g")
    sent = await box.send(records, offset=offset, holdback=holds)
    assert {o.decision for o in sent} == {"a", "c"} and len(sent) == 4
    assert holds.held == {"big": "send"}
    assert sorted(values(await kit.visible(events))) == [b"leased a", b"leased c"]
    assert values(await kit.visible(kit.topics.dispatch("small"))) == [b"d" * 16]
    assert await kit.committed("g", events) == 3
    # A decision held back is not sent at all while held.
    again = await box.send(lease(kit, "big"), offset=None, holdback=holds)
    assert again == []


async def test_a_refused_effect_fails_the_send_and_nothing_of_it_commits(kit: Kit) -> None:
    events = kit.topics.events
    box = await kit.outbox("tx-0")
    effect = Outgoing(topic=kit.topics.dispatch("small"), key=b"j", value=b"e" * 4 * SMALL_BYTES)
    with pytest.raises(RecordRefused):
        await box.send(
            [*lease(kit, "a"), effect], offset=ConsumerOffset(events, 0, 2, "g"), holdback=Holds()
        )
    assert await kit.visible(events) == [] and await kit.committed("g", events) is None
