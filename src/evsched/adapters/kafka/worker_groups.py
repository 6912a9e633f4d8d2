"""Which queues the worker pools of a namespace serve now, as their groups' coordinators say."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.errors import for_code

from evsched.adapters.kafka.kept_admin import KeptAdmin
from evsched.adapters.kafka.topics import Topics
from evsched.errors import BrokerUnavailable
from evsched.settings import Settings

# Always described, listed or not: describing a group needs Describe on it, and listing only
# leaves out the groups the principal may not describe, so without this a missing ACL would look
# like "no worker anywhere" instead of an error.
PROBE_POOL = "default"

# A pool's members, per queue whose dispatch topic they hold partitions of; None while the group
# rebalances (its coordinator tells members and assignments only once the group is stable).
PoolQueues = Mapping[str, int] | None


class WorkerGroups:
    """Lists the groups ``<ns>.workers.<pool>`` and describes them, over one admin client kept
    between asks (``KeptAdmin``: a failed ask drops it)."""

    def __init__(self, settings: Settings, *, timeout_s: float = 5.0) -> None:
        topics = Topics(settings.namespace)
        self._prefix = f"{settings.namespace}.workers."
        self._dispatch = topics.dispatch_prefix
        self._admin = KeptAdmin(settings, timeout_s=timeout_s)

    async def pools(self) -> dict[str, PoolQueues]:
        """Group id -> its members per queue (None: rebalancing), for every pool of the
        namespace with members; BrokerUnavailable when a group cannot be listed or described
        (an authorization included)."""
        async with self._admin.ask("cannot describe the worker groups") as admin:
            listed = await admin.list_consumer_groups()
            ids = {g[0] for g in listed if isinstance(g[0], str) and g[0].startswith(self._prefix)}
            # One group per request: aiokafka 0.14 decodes DescribeGroups answers with the v2
            # schema, while the broker writes each group's authorized_operations (v3) after it,
            # so every group but the first of a response comes out garbled (seen on Kafka 3.9:
            # error -32768, an empty name, or a buffer underrun that drops the connection).
            responses = [
                response
                for group in sorted({*ids, self._probe})
                for response in await admin.describe_consumer_groups([group])
            ]
        pools: dict[str, PoolQueues] = {}
        for response in responses:
            for error, group, state, _type, _protocol, members, *_ in response.groups:
                if error:  # e.g. 30, not authorized; 14 or 15 while a coordinator loads
                    why = f"error {error} ({for_code(error).__name__})"
                    raise BrokerUnavailable(f"cannot describe the worker group {group!r}: {why}")
                if members:
                    pools[group] = self._queues(members) if state == "Stable" else None
        return pools

    @property
    def _probe(self) -> str:
        return self._prefix + PROBE_POOL

    def _queues(self, members: Any) -> Counter[str]:
        served: Counter[str] = Counter()
        for _member, _client, _host, _metadata, assignment in members:
            served.update(self._assigned(assignment))
        return served

    def _assigned(self, raw: bytes) -> set[str]:
        if not raw:
            return set()
        decoded = ConsumerProtocolMemberAssignment.decode(raw)
        prefix = self._dispatch
        return {
            topic[len(prefix) :]
            for topic, partitions in decoded.assignment
            if partitions and topic.startswith(prefix)
        }

    async def close(self) -> None:
        await self._admin.close()
