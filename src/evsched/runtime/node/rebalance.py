"""The node's side of the group's rebalances: what the group revokes is closed before its callback
returns, and what it assigns is only recorded there and opened in the background.

aiokafka heartbeats again only once ``on_partitions_assigned`` returns (``runtime.node.openings``),
and a partition revoked must be closed before the group hands it to another member: its producer
must not outlive the revoke and fence the new owner's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from evsched.runtime.node.opener import PartitionOpener
from evsched.runtime.node.standby import Standby


class GroupMember(Protocol):
    """The node, as its rebalance listener drives it."""

    rebalancing: bool  # between the group's revoke and assign callbacks
    lock: asyncio.Lock  # partitions open, close and are adopted one holder at a time
    standby: Standby | None
    opener: PartitionOpener

    async def revoke(self, partitions: Iterable[int]) -> None: ...

    def assigned(self, partitions: Iterable[int]) -> list[int]: ...

    async def open_assigned(self, partitions: list[int]) -> None: ...


class NodeRebalance:
    """Closes what the group revokes before it returns; starts opening what it assigns."""

    def __init__(self, node: GroupMember) -> None:
        self.node = node

    async def revoked(self, partitions: list[int]) -> None:
        # Called at the start of every rebalance (with nothing on the first join).
        self.node.rebalancing = True
        async with self.node.lock:
            await self.node.revoke(partitions)
            if self.node.standby is not None:  # followed again, as a standby copy
                await self.node.standby.hold(partitions)

    async def assigned(self, partitions: list[int]) -> None:
        # No await: aiokafka heartbeats again only once this returns (``runtime.node.openings``).
        try:
            node = self.node
            node.opener.openings.start(node.assigned(partitions), node.open_assigned)
        finally:
            self.node.rebalancing = False
