"""evsched's Kafka topics: their names, the configs the engine needs, and checked provisioning."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from evsched.adapters.kafka.access import raise_if_refused
from evsched.adapters.kafka.broker_count import count_brokers
from evsched.adapters.kafka.topic_spread import spread
from evsched.core.bounds import namespace_refusal, queue_refusal
from evsched.errors import EvschedError
from evsched.settings import Settings

DAY_MS = 86_400_000
DISPATCH_RETENTION_MS = 7 * DAY_MS
INFINITE = "-1"
# ``<ns>.events`` may be trimmed once the changelog (``<ns>.state``) holds every partition's index:
# a finite retention.ms is accepted from this floor up (the default retention period of finished
# jobs in the index, so a job's whole history stays in the log at least as long as its state).
EVENTS_RETENTION_FLOOR_MS = 7 * DAY_MS
# A changelog record holds an event's bytes plus its timeline entry: room for any event the
# events topic takes (1 MB by default), so one large event never stops its partition.
STATE_MAX_MESSAGE_BYTES = 4 << 20
HOUR_MS = 3_600_000
# The changelog's compaction in small steps (Kafka's defaults are for data topics): a segment is
# cleanable once it rolls, at 64 MiB or after an hour. With the default 1 GiB segments the first
# compaction waited for a whole GiB per partition and then rewrote 6 GB at once, stalling a 2-core
# box's pipeline for 4 minutes (the 3M-job soak, docs/bench-log.md), and a restore read up to
# 1 GiB of uncompacted changes per partition. Purged keys' tombstones are kept an hour, not a
# day: a restore reads a partition's changelog from its start in one pass and must finish within
# delete.retention.ms to see every tombstone (64,802 live jobs restore in 6.4 s, 453,688 in
# 40 s: bench/restore.py); at 400 jobs/s a day holds some 35 million purged jobs' tombstones.
STATE_TUNING = {
    "segment.bytes": str(64 << 20),
    "segment.ms": str(HOUR_MS),
    "delete.retention.ms": str(HOUR_MS),
}


class TopicProvisioningError(EvschedError):
    """Topics could not be created or checked (broker unreachable, request refused, timeout)."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One setting of an existing topic that differs from what evsched needs."""

    topic: str
    setting: str
    actual: str
    expected: str

    def __str__(self) -> str:
        return (
            f"topic {self.topic!r} has {self.setting}={self.actual}, evsched needs {self.expected}"
        )


class TopicRefused(TopicProvisioningError):
    """The broker refused to create a topic (its name, a policy, an authorization)."""


class TopicMissing(TopicProvisioningError):
    """A topic evsched only checks (never creates) does not exist, e.g. an undeclared queue's."""


class TopicMisconfigured(TopicProvisioningError):
    """An existing topic is configured differently from what evsched needs; it is never used so."""

    def __init__(self, mismatches: Sequence[Mismatch]) -> None:
        self.mismatches = tuple(mismatches)
        details = "; ".join(str(m) for m in self.mismatches)
        super().__init__(f"{details} (change or delete the topic; evsched will not use it as is)")


@dataclass(frozen=True, slots=True)
class Topics:
    """One namespace's topic names: ``<ns>.events``, ``<ns>.effects``, ``<ns>.dispatch.<q>``."""

    namespace: str

    def __post_init__(self) -> None:
        _check_name_part(namespace_refusal(self.namespace))

    @property
    def events(self) -> str:
        return f"{self.namespace}.events"

    @property
    def effects(self) -> str:
        return f"{self.namespace}.effects"

    @property
    def state(self) -> str:
        """The compacted changelog of every partition's index (``runtime.projection.changelog``)."""
        return f"{self.namespace}.state"

    def dispatch(self, queue: str) -> str:
        _check_name_part(queue_refusal(queue))
        return f"{self.dispatch_prefix}{queue}"

    @property
    def dispatch_prefix(self) -> str:
        """What every dispatch topic's name starts with; the queue's name follows it."""
        return f"{self.namespace}.dispatch."

    @property
    def node_group(self) -> str:
        """The consumer group of the namespace's nodes: its assignment is the ownership."""
        return f"{self.namespace}.nodes"


def _check_name_part(refusal: str | None) -> None:
    # The same limits the fold and the API apply: a name they accept always makes a topic.
    if refusal is not None:
        raise ValueError(f"can't be part of a Kafka topic name: {refusal}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicSpec:
    """A topic as evsched needs it; ``configs`` are checked one by one on an existing topic."""

    name: str
    partitions: int
    # None: chosen when provisioned, by choose_replication from the cluster's broker count.
    replication_factor: int | None = None
    min_insync: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)
    # Set on the events topic: an existing topic's retention.ms may be infinite or this or more.
    retention_floor_ms: int | None = None
    # Set on dispatch topics: an existing one may have been grown past ``partitions``
    # (``evsched queues partitions``); fewer is still reported.
    partitions_may_grow: bool = False
    # Set when the topic is created, never checked: an operator may tune them otherwise.
    tuning: Mapping[str, str] = field(default_factory=dict)


MIN_INSYNC = "min.insync.replicas"


@dataclass(frozen=True, slots=True)
class Replication:
    """How many copies of each partition, and how many must have a write before it is acked."""

    factor: int
    min_insync: int


def choose_replication(brokers: int, configured: int | None = None) -> Replication:
    """The one replication choice for every evsched topic: ``configured`` or min(3, brokers).

    Two in-sync replicas from a factor of 3: an acks=all write survives losing any one broker,
    and one broker may be down (a rolling restart) without refusing writes.
    """
    factor = configured if configured is not None else max(1, min(3, brokers))
    return Replication(factor=factor, min_insync=2 if factor >= 3 else 1)


def _replicated(spec: TopicSpec, brokers: int) -> TopicSpec:
    chosen = choose_replication(brokers, spec.replication_factor)
    return replace(
        spec,
        replication_factor=chosen.factor,
        min_insync=spec.min_insync if spec.min_insync is not None else chosen.min_insync,
    )


def topic_specs(
    namespace: str,
    *,
    event_partitions: int,
    queues: Iterable[str],
    dispatch_partitions: int | None = None,
    effects_partitions: int | None = None,
    replication_factor: int | None = None,
    dispatch_retention_ms: int = DISPATCH_RETENTION_MS,
    events_retention_floor_ms: int = EVENTS_RETENTION_FLOOR_MS,
) -> list[TopicSpec]:
    """The namespace's topics; dispatch and effects default to as many partitions as events.

    A dispatch topic may have more partitions than ``dispatch_partitions`` (it was grown while
    its queue ran): the node spreads dispatch records over however many it has.
    """
    names = Topics(namespace)
    forever = {"cleanup.policy": "delete", "retention.ms": INFINITE, "retention.bytes": INFINITE}
    # The fold reads time from the broker's append time, never from a producer's clock.
    events = TopicSpec(
        name=names.events,
        partitions=event_partitions,
        replication_factor=replication_factor,
        configs={**forever, "message.timestamp.type": "LogAppendTime"},
    )
    events = replace(events, retention_floor_ms=events_retention_floor_ms)
    effects = TopicSpec(
        name=names.effects,
        partitions=effects_partitions or event_partitions,
        replication_factor=replication_factor,
        configs=forever,
    )
    # Compacted: the newest value of each index key survives, tombstones delete (Kafka Streams'
    # changelog). Partitioned as the events, partition for partition.
    state = TopicSpec(
        name=names.state,
        partitions=event_partitions,
        replication_factor=replication_factor,
        configs={"cleanup.policy": "compact", "max.message.bytes": str(STATE_MAX_MESSAGE_BYTES)},
        tuning=STATE_TUNING,
    )
    dispatch = [
        TopicSpec(
            name=names.dispatch(queue),
            partitions=dispatch_partitions or event_partitions,
            replication_factor=replication_factor,
            configs={"cleanup.policy": "delete", "retention.ms": str(dispatch_retention_ms)},
            partitions_may_grow=True,
        )
        for queue in dict.fromkeys(queues)
    ]
    return [events, *dispatch, effects, state]


@dataclass(frozen=True, slots=True, kw_only=True)
class ObservedTopic:
    """What the cluster says about an existing topic."""

    partitions: int
    replication_factor: int
    configs: Mapping[str, str]


def find_mismatches(spec: TopicSpec, observed: ObservedTopic) -> list[Mismatch]:
    """Every way ``observed`` differs from ``spec``; more replicas or a higher min ISR is fine."""
    found = []
    grown = spec.partitions_may_grow and observed.partitions > spec.partitions
    if observed.partitions != spec.partitions and not grown:
        expected = f">= {spec.partitions}" if spec.partitions_may_grow else str(spec.partitions)
        found.append(Mismatch(spec.name, "partitions", str(observed.partitions), expected))
    if (
        spec.replication_factor is not None
        and observed.replication_factor < spec.replication_factor
    ):
        found.append(
            Mismatch(
                spec.name,
                "replication.factor",
                str(observed.replication_factor),
                f">= {spec.replication_factor}",
            )
        )
    actual_isr = observed.configs.get(MIN_INSYNC)
    if spec.min_insync is not None and int(actual_isr or 1) < spec.min_insync:
        found.append(Mismatch(spec.name, MIN_INSYNC, str(actual_isr), f">= {spec.min_insync}"))
    for key, wanted in spec.configs.items():
        actual = observed.configs.get(key)
        expected = wanted
        if key == "retention.ms" and spec.retention_floor_ms is not None:
            expected = _retention_refusal(actual, spec.retention_floor_ms) or str(actual)
        if actual != expected:
            found.append(Mismatch(spec.name, key, str(actual), expected))
    return found


def _retention_refusal(actual: str | None, floor_ms: int) -> str | None:
    """What a trimmed events topic needs instead of ``actual`` (None: it is acceptable)."""
    try:
        value = int(actual or "")
    except ValueError:
        value = 0
    if value == -1 or value >= floor_ms:
        return None
    return f"-1 (infinite) or >= {floor_ms} (the changelog <ns>.state restores what is trimmed)"


async def ensure_topics(
    bootstrap: str,
    namespace: str,
    *,
    event_partitions: int,
    queues: Iterable[str],
    dispatch_partitions: int | None = None,
    effects_partitions: int | None = None,
    replication_factor: int | None = None,
    dispatch_retention_ms: int = DISPATCH_RETENTION_MS,
    timeout_s: float = 30.0,
    create: bool = True,
    **client_options: Any,
) -> list[str]:
    """Create the namespace's missing topics and check every one; their names, events first.

    ``client_options`` go to aiokafka's admin client as they are (TLS/SASL settings).
    Raises TopicMisconfigured when an existing topic differs from what evsched needs, and,
    with ``create=False``, TopicMissing instead of creating one.
    """
    specs = topic_specs(
        namespace,
        event_partitions=event_partitions,
        queues=queues,
        dispatch_partitions=dispatch_partitions,
        effects_partitions=effects_partitions,
        replication_factor=replication_factor,
        dispatch_retention_ms=dispatch_retention_ms,
    )
    await provision(bootstrap, specs, timeout_s=timeout_s, create=create, **client_options)
    return [spec.name for spec in specs]


async def ensure_namespace_topics(
    settings: Settings, *, queues: Iterable[str], **options: Any
) -> list[str]:
    """``ensure_topics`` for the namespace, partitions, replication and client options of
    ``settings``; ``options`` are ensure_topics' others (``timeout_s``, ``create``)."""
    return await ensure_topics(
        settings.bootstrap,
        settings.namespace,
        event_partitions=settings.event_partitions,
        queues=queues,
        dispatch_partitions=settings.dispatch_partitions,
        replication_factor=settings.replication_factor,
        **options,
        **dict(settings.kafka_options),
    )


async def provision(
    bootstrap: str,
    specs: Sequence[TopicSpec],
    *,
    timeout_s: float = 30.0,
    create: bool = True,
    **client_options: Any,
) -> None:
    """Create the topics of ``specs`` that don't exist, then check all of them against ``specs``.

    A spec without a replication factor or min ISR gets ``choose_replication``'s for the
    cluster's broker count, brokers fenced for a moment included (``broker_count``). With
    ``create=False`` a missing topic raises TopicMissing: only the checks are made.
    """
    timeout_ms = int(timeout_s * 1000)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms, **client_options
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            # Past the largest factor asked for (3 by default), more brokers change nothing.
            enough = max([3, *(spec.replication_factor or 0 for spec in specs)])
            brokers = await count_brokers(admin, enough=enough)
            specs = [_replicated(spec, brokers) for spec in specs]
            created = await _create_missing(
                admin, specs, timeout_ms, create=create, brokers=brokers
            )
            observed = await _observe_when_visible(admin, [spec.name for spec in specs])
    except KafkaError as exc:
        await raise_if_refused(bootstrap, exc, **client_options)
        raise TopicProvisioningError(f"provisioning topics on {bootstrap} failed: {exc!r}") from exc
    except TimeoutError as exc:
        raise TopicProvisioningError(
            f"provisioning topics on {bootstrap} took more than {timeout_s} s"
        ) from exc
    finally:
        await admin.close()
    if created:
        # Whoever enqueues on a new queue next may ask any broker whether it is declared.
        await spread(bootstrap, created, **client_options)
    found = [m for spec in specs for m in find_mismatches(spec, observed[spec.name])]
    if found:
        raise TopicMisconfigured(found)


def _new_topic(spec: TopicSpec, brokers: int) -> NewTopic:
    factor = spec.replication_factor or 1
    if factor > brokers:
        raise TopicRefused(
            f"creating topic {spec.name!r} needs {factor} brokers for replication factor "
            f"{factor} but {brokers} are in the cluster (set EVSCHED_REPLICATION_FACTOR, or "
            "start them)"
        )
    configs = {**spec.tuning, **spec.configs, MIN_INSYNC: str(spec.min_insync or 1)}
    return NewTopic(spec.name, spec.partitions, factor, topic_configs=configs)


async def _create_missing(
    admin: AIOKafkaAdminClient,
    specs: Sequence[TopicSpec],
    timeout_ms: int,
    *,
    create: bool,
    brokers: int,
) -> list[str]:
    """Create the missing topics of ``specs``; their names."""
    existing = set(await admin.list_topics())
    missing = [spec for spec in specs if spec.name not in existing]
    if not missing:
        return []
    if not create:
        raise TopicMissing(f"topics {[spec.name for spec in missing]} do not exist")
    new_topics = [_new_topic(spec, brokers) for spec in missing]
    response = await admin.create_topics(new_topics, timeout_ms=timeout_ms)
    for result in response.to_object()["topic_errors"]:
        error = for_code(result["error_code"])
        # Another process may have created it meanwhile; it gets checked like any existing topic.
        if result["error_code"] != 0 and error is not TopicAlreadyExistsError:
            detail = result.get("error_message") or error.__name__
            raise TopicRefused(f"creating topic {result['topic']!r} failed: {detail}")
    return [spec.name for spec in missing]


async def _observe_when_visible(
    admin: AIOKafkaAdminClient, names: Sequence[str]
) -> dict[str, ObservedTopic]:
    # A topic just created may take a moment to reach the broker's metadata cache.
    while True:
        try:
            return await _observe(admin, names)
        except KafkaError as exc:
            if not exc.retriable:
                raise
        await asyncio.sleep(0.1)


async def _observe(admin: AIOKafkaAdminClient, names: Sequence[str]) -> dict[str, ObservedTopic]:
    layout: dict[str, tuple[int, int]] = {}
    for topic in await admin.describe_topics(list(names)):
        _raise_for_code(topic["error_code"], topic["topic"])
        partitions = topic["partitions"]
        replicas = min((len(p["replicas"]) for p in partitions), default=0)
        layout[topic["topic"]] = (len(partitions), replicas)
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    configs: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for resource in response.to_object()["resources"]:
            _raise_for_code(resource["error_code"], resource["resource_name"])
            entries = resource["config_entries"]
            configs[resource["resource_name"]] = {
                e["config_names"]: e["config_value"] for e in entries
            }
    return {
        name: ObservedTopic(
            partitions=layout[name][0], replication_factor=layout[name][1], configs=configs[name]
        )
        for name in names
    }


def _raise_for_code(code: int, topic: str) -> None:
    if code != 0:
        raise for_code(code)(f"topic {topic!r}")


async def partition_count(
    bootstrap: str, topic: str, *, timeout_s: float = 30.0, **client_options: Any
) -> int:
    """How many partitions ``topic`` has; TopicProvisioningError when it can't be described."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000), **client_options
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            (described,) = await _describe_retrying(admin, topic)
    except KafkaError as exc:
        await raise_if_refused(bootstrap, exc, **client_options)
        raise TopicProvisioningError(f"describing {topic} on {bootstrap} failed: {exc!r}") from exc
    except TimeoutError as exc:
        raise TopicProvisioningError(f"describing {topic} took more than {timeout_s} s") from exc
    finally:
        await admin.close()
    _raise_for_code(described["error_code"], topic)
    return len(described["partitions"])


async def _describe_retrying(admin: AIOKafkaAdminClient, topic: str) -> Any:
    """describe_topics, asked again while the broker it picked is down (the caller's timeout
    bounds it): a dead broker stays in the metadata until the controller fences it."""
    while True:
        try:
            return await admin.describe_topics([topic])
        except KafkaError as exc:
            if not exc.retriable:
                raise
        await asyncio.sleep(0.2)
