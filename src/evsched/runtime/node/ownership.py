"""Whether a fenced partition has a new owner or only lost its transaction: the group decides.

aiokafka reports two different things as ``ProducerFenced`` (the outbox's ``Fenced``): a newer
producer took the partition's transactional id (the group gave the partition to another node,
whose revoke is on its way here), and a transaction the broker aborted itself after
``transaction.timeout.ms`` (it bumps the producer's epoch: ``InvalidProducerEpoch``), e.g. one
that waited through a long outage of too few in-sync replicas. Reopening in the first case
would fence the new owner back; waiting for a rebalance in the second would idle the partition
until one happens, which may be never. So the node asks the group's coordinator which member
holds the partition in the assignment in force: this node's member reopens it (a new producer,
from its index and the group's committed offset, as after a restart); another member's is left
to the revoke; while the group rebalances or its coordinator does not answer, it asks again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

from evsched.adapters.clock import monotonic_s
from evsched.errors import BrokerUnavailable

# The first wait before asking the group again when it gave no answer; each one doubles it.
ASK_AGAIN_FIRST_S = 0.5
ASK_AGAIN_MAX_S = 10.0


class Holder(enum.Enum):
    """Who holds a partition in the group's assignment in force."""

    THIS_NODE = "this node"  # nobody took it: the transaction was lost, not the partition
    ANOTHER = "another member"  # a new owner: its revoke reaches this node soon
    UNKNOWN = "unknown"  # the group is rebalancing, or its coordinator did not answer


class GroupView(Protocol):
    """The group's assignment in force (``adapters.kafka.groups.GroupOwners``)."""

    async def members(self, group_id: str, topic: str) -> dict[int, str]:
        """Partition -> member id; empty while the group is not stable."""
        ...


class Waiting(Protocol):
    """The fenced partition's runner: closed by a revoke, woken early by records or a close."""

    @property
    def closing(self) -> bool: ...

    async def wait(self, timeout_s: float) -> None: ...


class Ownership:
    """Asks the nodes' group who holds a partition whose producer was fenced."""

    def __init__(
        self,
        view: GroupView,
        *,
        group_id: str,
        topic: str,
        member_id: Callable[[], str | None],
    ) -> None:
        self.view = view
        self.group_id = group_id
        self.topic = topic
        self.member_id = member_id  # this node's, read at each ask (a rejoin changes it)

    async def holder(self, partition: int) -> Holder:
        """One ask of the group's coordinator."""
        try:
            members = await self.view.members(self.group_id, self.topic)
        except BrokerUnavailable:
            return Holder.UNKNOWN
        found = members.get(partition)
        if found is None:
            return Holder.UNKNOWN
        return Holder.THIS_NODE if found == self.member_id() else Holder.ANOTHER

    async def settle(self, partition: int, runner: Waiting) -> Holder | None:
        """Ask until the group answers; None when the runner closed first (a revoke came, and
        closes the partition)."""
        delay = ASK_AGAIN_FIRST_S
        while not runner.closing:
            found = await self.holder(partition)
            if found is not Holder.UNKNOWN:
                return found
            until = monotonic_s() + delay
            while not runner.closing and (left := until - monotonic_s()) > 0:
                await runner.wait(left)
            delay = min(2 * delay, ASK_AGAIN_MAX_S)
        return None
