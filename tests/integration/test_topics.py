"""Topic provisioning: names, specs and mismatch detection, then ensure_topics on a real broker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from evsched.adapters.kafka.topic_spread import spread
from evsched.adapters.kafka.topics import (
    DISPATCH_RETENTION_MS,
    EVENTS_RETENTION_FLOOR_MS,
    STATE_TUNING,
    ObservedTopic,
    TopicMisconfigured,
    TopicMissing,
    TopicProvisioningError,
    Topics,
    ensure_topics,
    find_mismatches,
    topic_specs,
)
from evsched.devstack.process import free_port

# --- without a broker ---------------------------------------------------------------------------


def test_topic_names_follow_the_namespace() -> None:
    names = Topics("prod")
    assert (names.events, names.effects, names.dispatch("emails")) == (
        "prod.events",
        "prod.effects",
        "prod.dispatch.emails",
    )


@pytest.mark.parametrize("bad", ["", "has space", "slash/y", "ünï"])
def test_names_kafka_cannot_hold_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="Kafka topic name"):
        Topics(bad)
    with pytest.raises(ValueError, match="Kafka topic name"):
        Topics("ok").dispatch(bad)


def test_specs_carry_what_the_engine_relies_on() -> None:
    events, default, emails, effects, state = topic_specs(
        "ns", event_partitions=6, queues=["default", "emails", "default"], dispatch_partitions=2
    )
    assert [s.name for s in (events, default, emails, effects, state)] == [
        "ns.events", "ns.dispatch.default", "ns.dispatch.emails", "ns.effects", "ns.state"
    ]  # fmt: skip
    assert state.configs["cleanup.policy"] == "compact" and state.partitions == 6
    assert int(state.configs["max.message.bytes"]) > 1 << 20  # any event fits in a record
    assert events.configs["message.timestamp.type"] == "LogAppendTime"
    assert events.configs["cleanup.policy"] == effects.configs["cleanup.policy"] == "delete"
    assert events.configs["retention.ms"] == effects.configs["retention.ms"] == "-1"
    assert default.configs["retention.ms"] == str(DISPATCH_RETENTION_MS)
    assert (events.partitions, default.partitions, effects.partitions) == (6, 2, 6)


def test_the_events_retention_may_be_infinite_or_at_least_the_floor() -> None:
    [events, *_] = topic_specs("ns", event_partitions=1, queues=[])
    assert events.retention_floor_ms == EVENTS_RETENTION_FLOOR_MS

    def found(retention: str) -> list[tuple[str, str, str]]:
        observed = ObservedTopic(
            partitions=1,
            replication_factor=1,
            configs={**events.configs, "retention.ms": retention},
        )
        return [(m.setting, m.actual, m.expected) for m in find_mismatches(events, observed)]

    assert found("-1") == found(str(EVENTS_RETENTION_FLOOR_MS)) == found("2592000000") == []
    [(setting, actual, expected)] = found("3600000")  # an hour: shorter than the floor
    assert (setting, actual) == ("retention.ms", "3600000")
    assert "-1 (infinite)" in expected and str(EVENTS_RETENTION_FLOOR_MS) in expected
    assert "<ns>.state" in expected


def test_every_difference_is_reported_and_more_replicas_are_fine() -> None:
    [spec, *_] = topic_specs("ns", event_partitions=6, queues=[], replication_factor=2)
    observed = ObservedTopic(
        partitions=3,
        replication_factor=3,
        configs={
            **spec.configs,
            "cleanup.policy": "compact",
            "message.timestamp.type": "CreateTime",
        },
    )
    found = {(m.setting, m.actual, m.expected) for m in find_mismatches(spec, observed)}
    assert found == {
        ("partitions", "3", "6"),
        ("cleanup.policy", "compact", "delete"),
        ("message.timestamp.type", "CreateTime", "LogAppendTime"),
    }
    fewer = ObservedTopic(partitions=6, replication_factor=1, configs=spec.configs)
    [too_few] = find_mismatches(spec, fewer)
    assert (too_few.setting, too_few.expected) == ("replication.factor", ">= 2")


def test_the_changelogs_tuning_is_set_at_creation_and_never_checked() -> None:
    *_, state = topic_specs("ns", event_partitions=2, queues=[])
    assert set(state.tuning) == {"segment.bytes", "segment.ms", "delete.retention.ms"}
    # Kafka's defaults, or whatever an operator chose since: not a mismatch.
    defaults = {"segment.bytes": str(1 << 30), "delete.retention.ms": "86400000"}
    tuned = ObservedTopic(partitions=2, replication_factor=1, configs={**state.configs, **defaults})
    assert find_mismatches(state, tuned) == []


async def test_unreachable_broker_is_an_evsched_error() -> None:
    with pytest.raises(TopicProvisioningError, match=r"127\.0\.0\.1"):
        await ensure_topics(
            f"127.0.0.1:{free_port()}", "ns", event_partitions=1, queues=[], timeout_s=3.0
        )


# --- on a broker --------------------------------------------------------------------------------


@pytest.fixture
async def admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


async def describe(admin: AIOKafkaAdminClient, topic: str) -> tuple[int, dict[str, str]]:
    [metadata] = await admin.describe_topics([topic])
    [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    [resource] = response.to_object()["resources"]
    configs = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
    return len(metadata["partitions"]), configs


@pytest.mark.broker
async def test_ensure_topics_creates_them_as_specified(
    kafka_bootstrap: str, fresh_namespace: str, admin: AIOKafkaAdminClient
) -> None:
    names = Topics(fresh_namespace)
    created = await ensure_topics(
        kafka_bootstrap, fresh_namespace, event_partitions=3, queues=["default", "emails"]
    )

    assert created == [
        names.events, names.dispatch("default"), names.dispatch("emails"), names.effects,
        names.state,
    ]  # fmt: skip
    partitions, events = await describe(admin, names.events)
    assert partitions == 3
    assert events["message.timestamp.type"] == "LogAppendTime"
    assert (events["cleanup.policy"], events["retention.ms"]) == ("delete", "-1")
    _, dispatch = await describe(admin, names.dispatch("emails"))
    assert (dispatch["cleanup.policy"], dispatch["retention.ms"]) == ("delete", "604800000")
    assert dispatch["message.timestamp.type"] == "CreateTime"
    _, effects = await describe(admin, names.effects)
    assert (effects["cleanup.policy"], effects["retention.ms"]) == ("delete", "-1")
    state_partitions, state = await describe(admin, names.state)
    assert (state_partitions, state["cleanup.policy"]) == (3, "compact")
    assert {k: state[k] for k in STATE_TUNING} == STATE_TUNING
    assert state["segment.bytes"] == str(64 << 20)


@pytest.mark.broker
async def test_checking_without_creating_refuses_a_missing_topic_and_creates_none(
    kafka_bootstrap: str, fresh_namespace: str, admin: AIOKafkaAdminClient
) -> None:
    # What a node does for a dispatch topic (D.13): look, never create.
    await ensure_topics(kafka_bootstrap, fresh_namespace, event_partitions=2, queues=["q"])
    checked = await ensure_topics(
        kafka_bootstrap, fresh_namespace, event_partitions=2, queues=["q"], create=False
    )
    assert f"{fresh_namespace}.dispatch.q" in checked
    with pytest.raises(TopicMissing, match=rf"{fresh_namespace}\.dispatch\.other"):
        await ensure_topics(
            kafka_bootstrap, fresh_namespace, event_partitions=2, queues=["other"], create=False
        )
    ours = {t for t in await admin.list_topics() if t.startswith(f"{fresh_namespace}.")}
    assert f"{fresh_namespace}.dispatch.other" not in ours


@pytest.mark.broker
async def test_ensure_topics_twice_is_a_no_op(
    kafka_bootstrap: str, fresh_namespace: str, admin: AIOKafkaAdminClient
) -> None:
    first = await ensure_topics(kafka_bootstrap, fresh_namespace, event_partitions=2, queues=["q"])
    second = await ensure_topics(kafka_bootstrap, fresh_namespace, event_partitions=2, queues=["q"])
    assert first == second
    ours = sorted(t for t in await admin.list_topics() if t.startswith(f"{fresh_namespace}."))
    assert ours == sorted(first)


@pytest.mark.broker
async def test_spread_waits_for_every_broker_and_names_those_that_never_list_a_topic(
    kafka_bootstrap: str, fresh_namespace: str, admin: AIOKafkaAdminClient
) -> None:
    [created, *_] = await ensure_topics(
        kafka_bootstrap, fresh_namespace, event_partitions=1, queues=[]
    )
    brokers = sorted(b["node_id"] for b in (await admin.describe_cluster())["brokers"])
    assert await spread(kafka_bootstrap, [created]) == []
    never = f"{fresh_namespace}.dispatch.never"
    assert await spread(kafka_bootstrap, [created, never], wait_s=1.0) == brokers
    assert never not in await admin.list_topics()  # asking about it did not create it


@pytest.mark.broker
async def test_a_pre_existing_create_time_events_topic_is_refused(
    kafka_bootstrap: str, fresh_namespace: str, admin: AIOKafkaAdminClient
) -> None:
    events = Topics(fresh_namespace).events
    [spec, *_] = topic_specs(fresh_namespace, event_partitions=3, queues=[])
    configs = {**spec.configs, "message.timestamp.type": "CreateTime"}
    wrong = NewTopic(events, 3, 1, topic_configs=configs)
    await admin.create_topics([wrong])

    with pytest.raises(TopicMisconfigured, match=r"message\.timestamp\.type") as caught:
        await ensure_topics(kafka_bootstrap, fresh_namespace, event_partitions=3, queues=["q"])

    [mismatch] = caught.value.mismatches
    assert (mismatch.topic, mismatch.setting) == (events, "message.timestamp.type")
    assert (mismatch.actual, mismatch.expected) == ("CreateTime", "LogAppendTime")
    assert events in str(caught.value)


@pytest.mark.broker
async def test_a_compacted_topic_with_other_partitions_is_refused(
    kafka_bootstrap: str, fresh_namespace: str, admin: AIOKafkaAdminClient
) -> None:
    effects = Topics(fresh_namespace).effects
    await admin.create_topics(
        [NewTopic(effects, 1, 1, topic_configs={"cleanup.policy": "compact"})]
    )

    with pytest.raises(TopicMisconfigured) as caught:
        await ensure_topics(kafka_bootstrap, fresh_namespace, event_partitions=3, queues=[])

    found = {(m.topic, m.setting, m.actual) for m in caught.value.mismatches}
    # Retention may differ too (brokers default to 7 days): every difference is reported.
    assert {(effects, "partitions", "1"), (effects, "cleanup.policy", "compact")} <= found
