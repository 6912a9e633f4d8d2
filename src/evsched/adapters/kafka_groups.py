"""Which member of a consumer group holds which partition, as the group's coordinator says."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import KafkaError

from evsched.errors import BrokerUnavailable
from evsched.settings import Settings


async def partition_owners(
    settings: Settings, group_id: str, topic: str, *, timeout_s: float = 5.0
) -> dict[int, str]:
    """Partition of ``topic`` -> the client id of the group member it is assigned to.

    Empty while the group has no members or is rebalancing (no assignment is in force then);
    BrokerUnavailable when the coordinator cannot be asked.
    """
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap,
        request_timeout_ms=int(timeout_s * 1000),
        **dict(settings.kafka_options),
    )
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            responses = await admin.describe_consumer_groups([group_id])
    except (KafkaError, TimeoutError, OSError) as exc:
        raise BrokerUnavailable(f"cannot describe consumer group {group_id}: {exc!r}") from exc
    finally:
        await admin.close()
    owners: dict[int, str] = {}
    for response in responses:
        for _error, _group, state, _type, _protocol, members, *_ in response.groups:
            if state != "Stable":
                continue
            for _member_id, client_id, _host, _metadata, assignment in members:
                for partition in _assigned(assignment, topic):
                    owners[partition] = client_id
    return owners


def _assigned(raw: bytes, topic: str) -> list[int]:
    if not raw:
        return []
    decoded = ConsumerProtocolMemberAssignment.decode(raw)
    return [p for name, partitions in decoded.assignment for p in partitions if name == topic]
