"""Which member of a consumer group holds which partition, as the group's coordinator says."""

from __future__ import annotations

from typing import Any

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from evsched.adapters.kafka.kept_admin import KeptAdmin
from evsched.settings import Settings


class GroupOwners:
    """Asks a consumer group's coordinator which member holds which partition, over one admin
    client started on the first ask and kept until :meth:`close` (a failed ask drops it, so the
    next ask starts afresh)."""

    def __init__(self, settings: Settings, *, timeout_s: float = 5.0) -> None:
        self._admin = KeptAdmin(settings, timeout_s=timeout_s)

    async def ask(self, group_id: str, topic: str) -> dict[int, str]:
        """Partition of ``topic`` -> the client id of the group member it is assigned to.

        Empty while the group has no members or is rebalancing (no assignment is in force
        then); BrokerUnavailable when the coordinator cannot be asked.
        """
        async with self._admin.ask(f"cannot describe consumer group {group_id}") as admin:
            responses = await admin.describe_consumer_groups([group_id])
        return _owners(responses, topic)

    async def members(self, group_id: str, topic: str) -> dict[int, str]:
        """Partition of ``topic`` -> the member id it is assigned to (a member id tells apart
        two members with one client id); empty, like ``ask``, unless the group is stable."""
        async with self._admin.ask(f"cannot describe consumer group {group_id}") as admin:
            responses = await admin.describe_consumer_groups([group_id])
        return _owners(responses, topic, by_member=True)

    async def close(self) -> None:
        await self._admin.close()


async def partition_owners(
    settings: Settings, group_id: str, topic: str, *, timeout_s: float = 5.0
) -> dict[int, str]:
    """``GroupOwners.ask`` once, with an admin client of its own."""
    owners = GroupOwners(settings, timeout_s=timeout_s)
    try:
        return await owners.ask(group_id, topic)
    finally:
        await owners.close()


def _owners(responses: Any, topic: str, *, by_member: bool = False) -> dict[int, str]:
    owners: dict[int, str] = {}
    for response in responses:
        for _error, _group, state, _type, _protocol, members, *_ in response.groups:
            if state != "Stable":
                continue
            for member_id, client_id, _host, _metadata, assignment in members:
                for partition in _assigned(assignment, topic):
                    owners[partition] = member_id if by_member else client_id
    return owners


def _assigned(raw: bytes, topic: str) -> list[int]:
    if not raw:
        return []
    decoded = ConsumerProtocolMemberAssignment.decode(raw)
    return [p for name, partitions in decoded.assignment for p in partitions if name == topic]
