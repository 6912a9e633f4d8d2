"""Adding partitions to a live dispatch topic, so a queue's worker pool can grow past it.

Kafka can add partitions to a topic but never take them away. A dispatch topic's records are
keyed by job id and a job is never looked up by its dispatch partition, so adding partitions
moves nothing a node or worker relies on: nodes spread new dispatch records over the new count
and the workers' group rebalances onto it (``adapters.kafka.clients.GROWTH_NOTICE_MS``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.errors import KafkaError, UnknownTopicOrPartitionError

from evsched.adapters.kafka.access import raise_if_refused
from evsched.adapters.kafka.topics import TopicMissing, TopicProvisioningError
from evsched.settings import Settings

# How often the topic is described while the new partitions reach the broker's metadata.
_POLL_S = 0.1


class ShrinkRefused(TopicProvisioningError):
    """Asked for fewer partitions than the topic has: Kafka cannot take partitions away."""


@dataclass(frozen=True, slots=True)
class Growth:
    """A topic's partition count before and after; equal when it already had the count."""

    topic: str
    before: int
    after: int


async def grow_partitions(
    settings: Settings, topic: str, count: int, *, timeout_s: float = 30.0
) -> Growth:
    """Give ``topic`` ``count`` partitions, waiting until its metadata shows them.

    Raises TopicMissing when the topic does not exist, ShrinkRefused when it has more than
    ``count``, TopicProvisioningError when the broker can't be asked or refuses.
    """
    options: dict[str, Any] = dict(settings.kafka_options)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap,
        request_timeout_ms=int(timeout_s * 1000),
        **options,
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            before = await _count(admin, topic)
            if count < before:
                raise ShrinkRefused(
                    f"{topic} has {before} partitions; Kafka cannot remove partitions "
                    f"(asked for {count})"
                )
            if count > before:
                await admin.create_partitions({topic: NewPartitions(total_count=count)})
                await _until_visible(admin, topic, count)
    except KafkaError as exc:
        await raise_if_refused(settings.bootstrap, exc, **options)
        raise TopicProvisioningError(f"adding partitions to {topic} failed: {exc}") from exc
    except TimeoutError as exc:
        raise TopicProvisioningError(
            f"adding partitions to {topic} took more than {timeout_s} s"
        ) from exc
    finally:
        await admin.close()
    return Growth(topic=topic, before=before, after=max(count, before))


async def _until_visible(admin: AIOKafkaAdminClient, topic: str, count: int) -> None:
    # The controller answers before every broker's metadata cache has the new partitions.
    while True:
        if await _count(admin, topic) >= count:
            return
        await asyncio.sleep(_POLL_S)


async def _count(admin: AIOKafkaAdminClient, topic: str) -> int:
    (described,) = await admin.describe_topics([topic])
    code = described["error_code"]
    if code == UnknownTopicOrPartitionError.errno:
        raise TopicMissing(f"topic {topic} does not exist")
    if code != 0:
        raise TopicProvisioningError(f"describing {topic} failed: error code {code}")
    return len(described["partitions"])
