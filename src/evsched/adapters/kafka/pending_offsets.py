"""A new owner's read of a committed offset an open transaction holds: wait, or fence its producer.

A node's transaction carries each partition's offset with metadata naming its producer's
transactional id and the group member that sent it (``node_transactions.committer``). A new
owner reads offsets stable (``rdkafka_group``): a transaction still open holds them. Whose:
- a producer whose member is no longer in the group (a killed node's, a node frozen past its
  session) will never commit: it is fenced, which aborts its transaction at once instead of when
  the broker's transaction timeout does;
- a live member's (a node mid-commit, a revoke that let a tick end after its closes) ends within
  the transaction timeout: the read waits for it; fencing would abort every partition's outputs
  of that node's tick and make it replace its producer.
A member still open past the transaction timeout is fenced too: the broker aborted its
transaction, or its producer is stuck. When the group's members cannot be listed, the read
waits as for a live one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from evsched.adapters.kafka.node_transactions import TRANSACTION_TIMEOUT_MS, committer_of
from evsched.adapters.kafka.rdkafka_options import rdkafka_config
from evsched.adapters.kafka.rdkafka_producer import CLIENT_LOGGER
from evsched.errors import BrokerUnavailable
from evsched.settings import Settings

log = structlog.get_logger("evsched.node")

# How long a committed offset may be held before its committer is looked up: a live owner's
# transaction takes milliseconds, and a clean revoke ends it before the group moves.
PENDING_WAIT_S = 2.0
# How long more a live member's transaction is waited for: the broker aborts it by then.
LIVE_WAIT_S = TRANSACTION_TIMEOUT_MS / 1000
# How long the read takes at most once the committer was fenced or waited for.
CALL_TIMEOUT_S = 10.0


@dataclass(slots=True, kw_only=True)
class PendingOffsets:
    """``committed``: a partition's stable committed offset, past a transaction holding it."""

    # Partition, timeout -> the stable committed offset; BrokerUnavailable when still held.
    stable: Callable[[int, float], Awaitable[int | None]]
    # Partition -> the metadata of its last committed offset (None: nothing or unreadable).
    last_committer: Callable[[int], Awaitable[str | None]]
    # The member ids of the group now; BrokerUnavailable when its coordinator does not answer.
    members: Callable[[], Awaitable[set[str]]]
    fence: Callable[[str], Awaitable[None]]
    pending_wait_s: float = PENDING_WAIT_S
    live_wait_s: float = LIVE_WAIT_S
    call_timeout_s: float = CALL_TIMEOUT_S

    async def committed(self, partition: int) -> int | None:
        with contextlib.suppress(BrokerUnavailable):
            return await self.stable(partition, self.pending_wait_s)
        last = await self.last_committer(partition)
        if last is None:
            return await self.stable(partition, self.call_timeout_s)
        transactional_id, member_id = committer_of(last)
        if await self._live(member_id):
            log.info(
                "offsets_held_by_live_member",
                partition=partition,
                transactional_id=transactional_id,
                member_id=member_id,
            )
            with contextlib.suppress(BrokerUnavailable):
                return await self.stable(partition, self.live_wait_s)
        await self.fence(transactional_id)
        return await self.stable(partition, self.call_timeout_s)

    async def _live(self, member_id: str | None) -> bool:
        if member_id is None:  # an offset committed outside the group (a tool's)
            return False
        try:
            return member_id in await self.members()
        except BrokerUnavailable as exc:
            log.warning("group_members_unknown", error=repr(exc))
            return True  # waiting costs time; fencing a live node costs its whole tick


class GroupMembers:
    """Lists a consumer group's member ids through an admin client made on the first ask."""

    def __init__(self, settings: Settings, group_id: str, *, client_id: str) -> None:
        self._config = {
            "bootstrap.servers": settings.bootstrap,
            "client.id": client_id,
            **rdkafka_config(settings.kafka_options),
            "logger": CLIENT_LOGGER,
        }
        self.group_id = group_id
        self._admin: AdminClient | None = None

    async def ids(self) -> set[str]:
        if self._admin is None:
            self._admin = AdminClient(self._config)
        futures = self._admin.describe_consumer_groups(
            [self.group_id], request_timeout=CALL_TIMEOUT_S
        )
        try:
            found = await asyncio.wrap_future(futures[self.group_id])
        except KafkaException as exc:
            raise BrokerUnavailable(f"members of group {self.group_id}: {exc!r}") from exc
        return {m.member_id for m in found.members}
