"""Partition ownership as the node group's coordinator reports it, on a real broker."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer
from tests.conftest import unique_name
from tests.integration.engine import wait_for

from evsched.adapters.kafka.groups import GroupOwners, partition_owners
from evsched.adapters.kafka.partition_log import GroupMembership
from evsched.adapters.kafka.rdkafka_group import RdkafkaGroupConsumer
from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.devstack.process import free_port
from evsched.errors import BrokerUnavailable
from evsched.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.asyncio]


async def test_owners_follow_the_group_assignment_through_a_rebalance(kafka_bootstrap: str) -> None:
    namespace = unique_name("owners")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=4, queues=())
    topics = Topics(namespace)
    settings = Settings(bootstrap=kafka_bootstrap, namespace=namespace, event_partitions=4)

    async def answered() -> tuple[dict[int, str]] | None:
        # A fresh broker has no group coordinator until __consumer_offsets is created.
        try:
            return (await partition_owners(settings, topics.node_group, topics.events),)
        except BrokerUnavailable:
            return None

    (before,) = await wait_for(answered, what="the group coordinator to answer", timeout_s=60)
    assert before == {}

    def member(name: str) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            topics.events,
            bootstrap_servers=kafka_bootstrap,
            group_id=topics.node_group,
            client_id=f"evsched-node-{name}",
        )

    first, second = member("a"), member("b")
    await first.start()
    try:

        async def owned_by(expected: set[str]) -> dict[int, str] | None:
            await first.getmany(timeout_ms=100)
            owners = await partition_owners(settings, topics.node_group, topics.events)
            ok = set(owners) == {0, 1, 2, 3} and set(owners.values()) == expected
            return owners if ok else None

        await wait_for(lambda: owned_by({"evsched-node-a"}), what="a owns all", timeout_s=60)
        await second.start()
        try:

            async def both() -> dict[int, str] | None:
                await second.getmany(timeout_ms=100)
                return await owned_by({"evsched-node-a", "evsched-node-b"})

            owners = await wait_for(both, what="a and b share", timeout_s=60)
            mine = {tp.partition for tp in second.assignment()}
            assert {p for p, c in owners.items() if c == "evsched-node-b"} == mine
        finally:
            await second.stop()
    finally:
        await first.stop()


async def test_an_unreachable_broker_is_broker_unavailable() -> None:
    settings = Settings(bootstrap=f"127.0.0.1:{free_port()}", namespace="x", event_partitions=1)
    with pytest.raises(BrokerUnavailable, match="cannot describe consumer group"):
        await partition_owners(settings, "x.nodes", "x.events", timeout_s=2)


class _Quiet:
    async def revoked(self, partitions: list[int]) -> None:
        pass

    async def assigned(self, partitions: list[int]) -> None:
        pass


async def test_a_node_finds_itself_by_member_id_in_the_assignment(kafka_bootstrap: str) -> None:
    """What a fenced node asks (runtime.node.ownership): its own member id against the group's."""
    namespace = unique_name("members")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=2, queues=())
    topics = Topics(namespace)
    settings = Settings(bootstrap=kafka_bootstrap, namespace=namespace, event_partitions=2)
    member = GroupMembership(
        settings=settings,
        topic=topics.events,
        group_id=topics.node_group,
        client_id="evsched-node-a",
        max_records=10,
    )
    consumer = RdkafkaGroupConsumer(member, listener=_Quiet())
    assert consumer.member_id() is None
    owners = GroupOwners(settings)
    await consumer.start()
    try:

        async def stable() -> dict[int, str] | None:
            await consumer.read_all(0.1, 10)
            members = await owners.members(topics.node_group, topics.events)
            return members if set(members) == {0, 1} else None

        members = await wait_for(stable, what="the group's assignment", timeout_s=60)
        assert set(members.values()) == {consumer.member_id()}
        assert consumer.member_id() != "evsched-node-a"  # the member id, not the client id
    finally:
        await owners.close()
        await consumer.close()
