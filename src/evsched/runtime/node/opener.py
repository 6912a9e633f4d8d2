"""How a node opens its partitions: on assignment, once an index restore is done, and again after
a failure, with why a partition did not open.

An open pauses the partition's fetches, opens its index on the node's threads, plans against the
changelog and the log's start (``runtime.node.index_restore``), starts the partition's transactional
producer and hands the node a runner. An index that cannot be used as it is goes to a restore
instead. A partition reopened from the node's poll loop (its open or a step failed, or its index
was just restored) never awaits its producer's start there nor under the node's lock: a start
waits for the transaction coordinator, as long as a slow or short-handed cluster takes, and the
poll loop and the group's revokes wait for that lock. The start runs beside the loop
(``runtime.node.outbox_starts``), and the partition opens on a later pass, once it has.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable
from pathlib import Path
from typing import Any, Protocol

from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.node_transactions import NodeOutbox
from evsched.adapters.kafka.rdkafka_group import GroupMember
from evsched.errors import IndexVersionMismatch
from evsched.runtime.node.health import NodeHealth
from evsched.runtime.node.index_restore import IndexRestores
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.openings import Openings, opened_side_by_side
from evsched.runtime.node.outbox_starts import OutboxStarts
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.partition.runner import PartitionRunner
from evsched.runtime.projection.changelog_restore import Action, OpenPlan
from evsched.runtime.projection.index_threads import IndexThreads, seek_to_index

# The partition's outbox, made and started (this fences any older one).
StartOutbox = Callable[[int], Awaitable[NodeOutbox]]
# The partition's owner on its open index and started outbox, at the group's offset and log end.
MakeOwner = Callable[[PartitionIndex, NodeOutbox, int | None, int], OwnedPartition]


class Opened(Protocol):
    """Takes a partition just opened and runs it (the node's); no await comes before it."""

    def __call__(
        self,
        consumer: GroupMember,
        runner: PartitionRunner,
        *,
        seed: bool,
        committed: int | None,
        end: int,
    ) -> None: ...


class PartitionOpener:
    """Opens a node's partitions; each one that does not open is marked FAILED, to retry later."""

    def __init__(
        self,
        *,
        data_dir: Path,
        health: NodeHealth,
        threads: IndexThreads,
        restores: IndexRestores,
        start_outbox: StartOutbox,
        make_owner: MakeOwner,
        opened: Opened,
        logger: Any,
    ) -> None:
        self.data_dir = data_dir
        self.health = health
        self.threads = threads  # the node's: index opens and closes, off the event loop
        self.restores = restores
        self.start_outbox = start_outbox
        self.make_owner = make_owner
        self.opened = opened
        self.log = logger
        self.openings = Openings(health, self.failed, logger)  # outside the group's callbacks
        self.outbox_starts: OutboxStarts[NodeOutbox] = OutboxStarts(start_outbox, logger=logger)
        # Partitions whose index was restored, waiting for their producer to start, each with the
        # plan to open it by (None: plan again).
        self._restored: dict[int, OpenPlan | None] = {}

    async def adopt(self, consumer: GroupMember, unowned: Iterable[int]) -> None:
        """Reopen each of the ``unowned`` assigned partitions that waits for it: its index was
        restored, or it failed (to open, to step) and its wait is over.

        Called from the poll loop under the node's lock, never while the group rebalances. The
        producer starts first, beside the loop: the partition reopens on a later pass, once it has.
        """
        for partition in unowned:
            if partition not in self._restored and not self.health.retry_due(partition):
                continue
            started = self.outbox_starts.take(partition)
            if started is not None:
                plan = self._restored.pop(partition, None)
                await self._reopen(consumer, partition, plan, outbox=started)

    def restored(self, partition: int, plan: OpenPlan | None) -> None:
        """The partition's index was restored (called under the node's lock): unless it was
        revoked meanwhile, start its producer; the poll loop opens it once it has (``adopt``)."""
        if self.health.phase(partition) is Phase.RESTORING:
            self._restored[partition] = plan
            self.outbox_starts.begin(partition)

    async def cancel(self, partitions: Collection[int]) -> None:
        """Give up every open under way of ``partitions`` (revoked); return once each has undone
        what it had opened or started."""
        await self.outbox_starts.cancel(partitions)
        await self.openings.cancel(partitions)  # first: each undoes what it opened
        for partition in partitions:
            await self.restores.cancel(partition)
            self._restored.pop(partition, None)

    async def _reopen(
        self,
        consumer: GroupMember,
        partition: int,
        plan: OpenPlan | None,
        *,
        outbox: NodeOutbox | Exception,
    ) -> None:
        """Open the partition again with its started ``outbox`` (or why it did not start); by
        ``plan`` when one was made, else planned anew."""
        if isinstance(outbox, Exception):
            self.health.move(partition, Phase.OPENING)
            self.failed(partition, outbox)
            return
        if (index := await self.index(consumer, partition)) is None:
            await outbox.close()
            return
        try:
            [planned] = [plan] if plan is not None else await self.restores.plans(consumer, [index])
            await self.open(consumer, index, planned, outbox)
        except Exception as exc:
            self.failed(partition, exc)

    def failed(self, partition: int, exc: Exception) -> None:
        """The partition did not open: left unowned (and paused), reopened later each time."""
        failures = self.health.failed(partition, f"open failed: {exc!r}")
        self.log.warning(
            "partition_open_failed", partition=partition, error=repr(exc), failures=failures
        )

    async def open_assigned(self, consumer: GroupMember, partitions: list[int]) -> None:
        """Open the partitions of an assignment side by side (their fetches are held already)."""
        # Each index opens on a thread, side by side (``index_threads.seek_to_index``).
        opening = [self.index(consumer, p) for p in partitions]
        indexes = await opened_side_by_side(opening, self.threads.close)
        try:
            plans = await self.restores.plans(consumer, indexes)
        except BaseException:  # cancelled (a revoke): no index is left open
            await asyncio.gather(*(self.threads.close(index) for index in indexes))
            raise
        # Side by side: each partition waits on its own producer's start (which aborts a killed
        # owner's open transaction) and offset round trips; in turn, a take-over of n
        # partitions took n times as long (issue 9, F.19).
        await asyncio.gather(
            *(self._open_logged(consumer, i, p) for i, p in zip(indexes, plans, strict=True))
        )

    async def _open_logged(
        self, consumer: GroupMember, index: PartitionIndex, plan: OpenPlan | BaseException
    ) -> None:
        try:
            await self.open(consumer, index, plan)
        except Exception as exc:
            self.failed(index.partition, exc)

    async def index(self, consumer: GroupMember, partition: int) -> PartitionIndex | None:
        """The partition's index, paused and sought (None: a rebuild started, or it failed)."""
        self.health.move(partition, Phase.OPENING)
        try:
            return await seek_to_index(self.threads, consumer, self.data_dir, partition)
        except IndexVersionMismatch as exc:
            self.restores.start(consumer, partition, _rebuilding(exc))
        except Exception as exc:
            self.failed(partition, exc)
        return None

    async def open(
        self,
        consumer: GroupMember,
        index: PartitionIndex,
        plan: OpenPlan | BaseException,
        started: NodeOutbox | None = None,
    ) -> None:
        """Run the partition on its (open) index as planned; ``plan`` may be why none was made.
        ``started``: its outbox, started already (else started here)."""
        partition = index.partition
        outbox = started
        owner: OwnedPartition | None = None
        # Of another fold version, behind the log's start, or far behind the changelog.
        if not isinstance(plan, BaseException) and plan.action is not Action.USE_LOCAL:
            await self.threads.close(index)
            if outbox is not None:
                await outbox.close()
            self.restores.start(consumer, partition, f"index: {plan.action.value}", plan)
            return
        try:
            if isinstance(plan, BaseException):
                raise plan
            if outbox is None:
                outbox = await self.start_outbox(partition)
            committed = await consumer.committed(partition)
            end = (await consumer.end_offsets([partition]))[partition]
            owner = self.make_owner(index, outbox, committed, end)
            runner = PartitionRunner(owner, consumer)
            owner.on_wake = runner.kick
            consumer.seek(partition, runner.fetched_to)
            consumer.resume(partition)
        except BaseException:
            # Whatever failed, the index is closed (its lock released) before a retry reopens it.
            if owner is not None:
                owner.leave()  # the node's budget
            if outbox is not None:
                await outbox.close()
            await self.threads.close(index)
            raise
        self.opened(consumer, runner, seed=plan.seed, committed=committed, end=end)


def _rebuilding(mismatch: IndexVersionMismatch) -> str:
    return (
        f"rebuilding its index from the log (fold version {mismatch.found} -> {mismatch.expected})"
    )
