"""Every topic on a real three-broker cluster (evsched.devstack.cluster): three replicas and min
ISR 2 whoever creates it, weaker topics reported by name, and writes that survive a killed broker.

Marked ``cluster`` and ``slow``: it starts three broker JVMs of its own (the shared broker is never
touched), on free ports, with the jars the session broker uses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from tests.conftest import unique_name
from tests.integration.clusters import heal, module_cluster
from tests.integration.engine import wait_for

from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.topics import TopicMisconfigured, TopicRefused, Topics, ensure_topics
from evsched.devstack.cluster import LocalCluster
from evsched.devstack.process import is_alive
from evsched.ports import Appended
from evsched.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three KRaft nodes on free ports for this module alone."""
    with module_cluster(tmp_path_factory.mktemp("cluster")) as local:
        yield local


@pytest.fixture
async def admin(cluster: LocalCluster) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def described(admin: AIOKafkaAdminClient, topic: str) -> dict[str, Any]:
    """The topic's description once every broker's metadata lists its partitions with leaders.

    A topic just created may be described by a broker whose metadata has not caught up yet: it
    answers with no partitions (or leaders of -1) for a moment.
    """

    found: dict[str, Any] = {}

    async def visible() -> bool:
        [answer] = await admin.describe_topics([topic])
        partitions = answer.get("partitions") or []
        found.update(answer)
        return bool(partitions) and all(p["leader"] >= 0 for p in partitions)

    await wait_for(visible, what=f"{topic}'s partitions in the metadata", timeout_s=60)
    return found


async def replication(admin: AIOKafkaAdminClient, topic: str) -> tuple[set[int], str]:
    """(replica counts over the topic's partitions, its min.insync.replicas)."""
    described_ = await described(admin, topic)

    async def min_isr() -> str | None:
        # A broker whose metadata has not caught up with the new topic answers without its
        # configs for a moment (ci14: no min.insync.replicas entry): ask again.
        resource_ = ConfigResource(ConfigResourceType.TOPIC, topic)
        [response] = await admin.describe_configs([resource_])
        [resource] = response.to_object()["resources"]
        configs = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
        found = configs.get("min.insync.replicas")
        if found is None:
            await asyncio.sleep(0.5)
        return found

    found = await wait_for(min_isr, what=f"{topic}'s min.insync.replicas", timeout_s=60)
    return {len(p["replicas"]) for p in described_["partitions"]}, found


async def test_every_topic_gets_three_replicas_and_min_isr_two(
    cluster: LocalCluster, admin: AIOKafkaAdminClient
) -> None:
    namespace = unique_name("cl")
    names = await ensure_topics(cluster.bootstrap, namespace, event_partitions=3, queues=[])
    # A queue declared later, as a worker of a new pool does: the same rule, without asking.
    names += await ensure_topics(cluster.bootstrap, namespace, event_partitions=3, queues=["new"])
    assert Topics(namespace).dispatch("new") in names
    for topic in set(names):
        assert await replication(admin, topic) == ({3}, "2"), topic


async def test_a_topic_below_the_setting_is_reported_by_name(
    cluster: LocalCluster, admin: AIOKafkaAdminClient
) -> None:
    namespace = unique_name("cl")
    weak = Topics(namespace).effects
    await admin.create_topics(
        [
            NewTopic(
                weak,
                3,
                1,
                topic_configs={
                    "retention.ms": "-1",
                    "retention.bytes": "-1",
                    "min.insync.replicas": "1",
                },
            )
        ]
    )
    with pytest.raises(TopicMisconfigured) as caught:
        await ensure_topics(cluster.bootstrap, namespace, event_partitions=3, queues=[])
    message = str(caught.value)
    assert f"topic {weak!r} has replication.factor=1, evsched needs >= 3" in message
    assert f"topic {weak!r} has min.insync.replicas=1, evsched needs >= 2" in message
    # Accepted on purpose: the setting says one replica is what this deployment wants.
    await ensure_topics(
        cluster.bootstrap, namespace, event_partitions=3, queues=[], replication_factor=1
    )


async def test_the_setting_overrides_the_default_and_cannot_exceed_the_brokers(
    cluster: LocalCluster, admin: AIOKafkaAdminClient
) -> None:
    two = unique_name("cl")
    await ensure_topics(cluster.bootstrap, two, event_partitions=1, queues=[], replication_factor=2)
    assert await replication(admin, Topics(two).events) == ({2}, "1")
    with pytest.raises(TopicRefused, match="needs 4 brokers for replication factor 4 but 3"):
        await ensure_topics(
            cluster.bootstrap, unique_name("cl"), event_partitions=1, queues=[],
            replication_factor=4,
        )  # fmt: skip


async def test_acknowledged_writes_survive_a_killed_broker_and_it_rejoins(
    cluster: LocalCluster, admin: AIOKafkaAdminClient
) -> None:
    namespace = unique_name("cl")
    await ensure_topics(cluster.bootstrap, namespace, event_partitions=3, queues=[])
    events = Topics(namespace).events
    found = await described(admin, events)
    leader = next(p["leader"] for p in found["partitions"] if p["partition"] == 0)
    victim = cluster.node(leader)
    pid = victim.status().pid
    assert pid is not None
    settings = Settings(bootstrap=cluster.bootstrap, namespace=namespace, event_partitions=3)
    log = KafkaEventLog(settings, client_id="cluster-test")
    await log.start()
    try:
        before = [await log.append(events, f"job-{i}", b"before") for i in range(30)]
        os.kill(pid, signal.SIGKILL)
        # acks=all with min ISR 2: every append after the kill still lands on two brokers.
        async with asyncio.timeout(120):
            after = [await log.append(events, f"job-{i}", b"after") for i in range(30)]
    finally:
        await log.close()
    assert len(before) == len(after) == 30
    assert victim.status().pid is None and not is_alive(pid)
    consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap)
    await consumer.start()
    try:
        partitions = [TopicPartition(events, p) for p in range(3)]
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
    assert sum(ends.values()) == 60  # every acknowledged append is there, none twice
    # Fenced, the dead broker is off the metadata's broker list, but the topics it had still name
    # it: a topic created now gets three replicas as well, one on it (CI: the next test's topic,
    # created while a restarted broker was still fenced, got two and min ISR 1).
    await wait_for(lambda: _fenced(cluster, leader), what="the killed broker fenced", timeout_s=120)
    meanwhile = unique_name("cl")
    await ensure_topics(cluster.bootstrap, meanwhile, event_partitions=3, queues=[])
    status = cluster.up()  # starts the killed node again, the others keep running
    assert status.running
    assert cluster.node(leader).status().pid not in {None, pid}
    await heal(cluster)  # every replica in sync again: the next test starts on a whole cluster
    assert await replication(admin, Topics(meanwhile).events) == ({3}, "2")


async def test_a_broker_frozen_past_its_session_timeout_is_fenced_then_rejoins(
    cluster: LocalCluster, admin: AIOKafkaAdminClient
) -> None:
    """Appends go on while a leader is frozen; the controller fences it, it rejoins every ISR
    once thawed, and every acknowledged append is where its ack said.

    Every wait has a deadline and every request a short timeout of its own: on a loaded box an
    append to the frozen leader waits out the producer's request timeout (30 s) before going to
    the new leader, and a probe that asks the frozen broker must not hold the test (the first
    version waited on each append and asked the frozen broker inside one probe).
    """
    namespace = unique_name("cl")
    await ensure_topics(cluster.bootstrap, namespace, event_partitions=3, queues=[])
    events = Topics(namespace).events
    found = await described(admin, events)
    # Every ISR can hold the thawed broker only if every partition has a replica on each broker
    # (CI: a topic created while a broker was fenced got two replicas; the wait below timed out).
    replicas = {p["partition"]: p["replicas"] for p in found["partitions"]}
    assert {len(r) for r in replicas.values()} == {3}, f"{events}'s replicas: {replicas}"
    leader = next(p["leader"] for p in found["partitions"] if p["partition"] == 0)
    pid = cluster.node(leader).status().pid
    assert pid is not None
    settings = Settings(bootstrap=cluster.bootstrap, namespace=namespace, event_partitions=3)
    log = KafkaEventLog(settings, client_id="cluster-test", ack_timeout_s=120)
    acked: dict[str, Appended] = {}
    stop = asyncio.Event()

    async def append_steadily() -> None:
        while not stop.is_set():
            key = f"job-{len(acked)}"
            acked[key] = await log.append(events, key, key.encode())
            with contextlib.suppress(TimeoutError):  # paced, not a wait on a condition
                await asyncio.wait_for(stop.wait(), 0.05)

    async def acked_past(count: int) -> bool:
        return len(acked) >= count

    await log.start()
    appender = asyncio.create_task(append_steadily())
    try:
        await wait_for(lambda: acked_past(10), what="appends before the freeze", timeout_s=60)
        os.kill(pid, signal.SIGSTOP)
        try:
            await wait_for(
                lambda: _fenced(cluster, leader), what="the frozen broker fenced", timeout_s=180
            )
            after_fence = len(acked)
            # The others lead its partitions now: appends go on (past the frozen leader's
            # request timeout, for any that was in flight to it).
            await wait_for(
                lambda: acked_past(after_fence + 10), what="appends after the fence", timeout_s=120
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        await _await_rejoined(cluster, events, leader)
        after_thaw = len(acked)
        await wait_for(
            lambda: acked_past(after_thaw + 10), what="appends after the thaw", timeout_s=120
        )
    finally:
        stop.set()
        await asyncio.wait_for(appender, 180)
        await log.close()
    written = {(a.partition, a.offset): key for key, a in acked.items()}
    found_records = await _read_all(cluster.bootstrap, events)
    missing = {pos: key for pos, key in written.items() if found_records.get(pos) != key}
    assert not missing, f"acknowledged appends not where their acks said: {missing}"
    assert set(found_records.values()) == set(acked), "records that no append wrote"


async def _fenced(cluster: LocalCluster, node_id: int) -> bool:
    """Whether the cluster's metadata no longer lists ``node_id`` (asked with a short timeout)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=5_000)
    try:
        await admin.start()
        brokers = (await admin.describe_cluster())["brokers"]
    except KafkaError:  # it asked the frozen broker: ask again
        return False
    finally:
        await admin.close()
    if node_id in {b["node_id"] for b in brokers}:
        await asyncio.sleep(0.5)
        return False
    return True


async def _await_rejoined(cluster: LocalCluster, topic: str, thawed: int) -> None:
    """Wait until every partition of ``topic`` has all its replicas in sync; on the deadline,
    fail with the ISRs last seen and the thawed broker's log tail (what it did last)."""
    seen: dict[int, tuple[list[int], list[int]]] = {}
    try:
        await wait_for(
            lambda: _rejoined(cluster, topic, seen), what="the thawed broker in every ISR",
            timeout_s=180,
        )  # fmt: skip
    except AssertionError as exc:
        server_log = cluster.node(thawed).files.server_log
        tail = "\n".join(server_log.read_text(errors="replace").splitlines()[-40:])
        raise AssertionError(
            f"{exc}; (replicas, isr) per partition last seen: {seen}; "
            f"broker {thawed}'s log tail ({server_log}):\n{tail}"
        ) from None


async def _rejoined(
    cluster: LocalCluster, topic: str, seen: dict[int, tuple[list[int], list[int]]]
) -> bool:
    """Whether every replica of ``topic`` is in its partition's ISR, as one broker answers.

    Each probe asks a broker of its own choosing (a new client): one whose metadata lags, the
    thawed broker's just after the thaw, is not asked every time.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=5_000)
    try:
        await admin.start()
        [described_] = await admin.describe_topics([topic])
    except KafkaError:
        return False
    finally:
        await admin.close()
    partitions = described_.get("partitions") or []
    seen.update({p["partition"]: (p["replicas"], p["isr"]) for p in partitions})
    if partitions and all(set(p["isr"]) == set(p["replicas"]) for p in partitions):
        return True
    await asyncio.sleep(0.5)
    return False


async def _read_all(bootstrap: str, topic: str) -> dict[tuple[int, int], str]:
    """Every record of ``topic``: (partition, offset) -> its value (the key it was written as)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(3)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        found: dict[tuple[int, int], str] = {}
        while any([await consumer.position(tp) < ends[tp] for tp in partitions]):
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                found.update({(r.partition, r.offset): r.value.decode() for r in records})
        return found
    finally:
        await consumer.stop()
