"""Each owned partition's task: step it whenever it has records or its next wake time comes, and
let go of it when a step fails or its producer is fenced.

Each owned partition runs on its own, so a due lease never waits for another partition's fold;
their sends meet in the node's next transaction (``adapters.kafka.node_transactions``). A
partition let go of is dropped from memory and closed; the node's poll loop reopens it from its
index, which stays consistent with the log, after a wait that grows while it keeps failing,
unless another member of the group owns it now (``runtime.node.ownership``).
"""

from __future__ import annotations

import asyncio
import contextlib
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from evsched.adapters.clock import monotonic_s, now_ms
from evsched.adapters.kafka.rdkafka_group import GroupMember
from evsched.errors import BrokerUnavailable, Fenced, PartitionRevoked
from evsched.runtime.node.health import NodeHealth
from evsched.runtime.node.index_restore import IndexRestores
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.ownership import Holder, Ownership
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.partition.runner import PartitionRunner

# Releases what a runner on its way out after an error held (the node's ``_drop``).
Drop = Callable[[PartitionRunner], Awaitable[None]]


class PartitionSteps:
    """Runs the owned partitions' tasks (``run``), each until it is revoked or lets go."""

    def __init__(
        self,
        *,
        restores: IndexRestores,
        health: NodeHealth,
        ownership: Ownership,
        max_records: int,
        max_idle_ms: int,
        step_interval_ms: int = 0,
        dropped: Any,
        drop: Drop,
        logger: Any,
    ) -> None:
        self.restores = restores  # seeds the changelog
        self.health = health
        self.ownership = ownership  # who holds a partition whose producer was fenced
        self.max_records = max_records
        self.max_idle_ms = max_idle_ms
        # A partition steps at most once per interval: under load its records and due work
        # gather into fewer, larger transactions; an idle partition steps at once.
        self.step_interval_s = step_interval_ms / 1000
        self.dropped = dropped  # evsched_node_partitions_dropped_total, or None without metrics
        self.drop = drop
        self.log = logger

    async def run(
        self, consumer: GroupMember, runner: PartitionRunner, *, seed: bool = False
    ) -> None:
        """Step one partition whenever it has records or its next wake time comes.

        ``seed``: write the index to the changelog first, here rather than in the rebalance,
        which must not wait for it; no step runs before it is done (the records fetched
        meanwhile wait in the inbox).
        """
        owner = runner.owner
        try:
            if seed:
                await self.restores.seed(owner)
            stepped_at: float | None = None
            while not runner.closing:
                await runner.wait(self._wait_s(owner))
                await self._spaced(stepped_at)
                if runner.closing:
                    return
                # Position before records: a fetch landing in between can only make the
                # "caught up" test late, never early.
                position = await consumer.position(owner.partition)
                records = runner.take(self.max_records)
                now = now_ms()
                if owner.has_work(records, now):
                    stepped_at = monotonic_s()
                    await owner.step(records, now, position)
                    self.health.stepped(owner.partition, caught_up=owner.caught_up)
        except PartitionRevoked:
            return  # revoked while we fetched; the listener closes it
        except Fenced as exc:
            if runner.closing:
                return  # revoked meanwhile: the revoke closes it
            reason = str(exc)
            traceback.clear_frames(exc.__traceback__)  # index handles: see _step_failed
            await self._fenced(consumer, runner, reason)
        except Exception as exc:
            if runner.closing:
                return  # revoked meanwhile: the revoke closes it
            self._step_failed(owner.partition, exc)
            del exc
            await self.drop(runner)

    def _step_failed(self, partition: int, exc: Exception) -> None:
        """Anything else (broker trouble, a producer that must be recreated): the partition's
        in-memory work goes, and the poll loop reopens it from its index later."""
        failures = self.health.failed(partition, f"step failed: {exc!r}")
        self.log.warning(
            "partition_step_failed",
            partition=partition,
            error=repr(exc),
            failures=failures,
            retry_in_s=self.health.retry_in_s(partition),
        )
        self._dropped("error")
        # The exception's frames may hold index handles (a scan, a write batch): RocksDB
        # would keep its lock and the reopen fail with "No locks available".
        traceback.clear_frames(exc.__traceback__)

    async def _fenced(self, consumer: GroupMember, runner: PartitionRunner, reason: str) -> None:
        """The partition's producer was fenced: by a new owner, or by the broker aborting a
        transaction that outlived its timeout (``runtime.node.ownership``). The group says which."""
        partition = runner.owner.partition
        with contextlib.suppress(PartitionRevoked, BrokerUnavailable):
            consumer.pause(partition)  # its runner steps no more; a reopen resumes it
        holder = await self.ownership.settle(partition, runner)
        if holder is None:
            return  # revoked while asking: the revoke closes it
        self.log.warning("partition_fenced", partition=partition, holder=holder.value)
        if holder is Holder.ANOTHER:
            # Reopening would fence the new owner back: wait for the revoke instead.
            self.health.move(partition, Phase.FENCED)
            self._dropped("fenced")
        else:
            # Nobody else has it: what the aborted transaction held never reached the log, and
            # the poll loop reopens the partition with a new producer from its index and the
            # committed offset, as a restart would; it decides again from there.
            self.health.failed(partition, f"transaction lost, still the owner: {reason}")
            self._dropped("transaction_lost")
        await self.drop(runner)

    def _dropped(self, reason: str) -> None:
        if self.dropped is not None:
            self.dropped.labels(reason).inc()

    async def _spaced(self, stepped_at: float | None) -> None:
        """Until ``step_interval_s`` after the last step began (at once without one)."""
        if stepped_at is not None and self.step_interval_s > 0:
            rest = stepped_at + self.step_interval_s - monotonic_s()
            if rest > 0:
                await asyncio.sleep(rest)

    def _wait_s(self, owner: OwnedPartition) -> float:
        """Sleep no longer than until the partition's next due time, and at most max_idle_ms."""
        wait_ms = self.max_idle_ms
        wake = owner.next_wake_at()
        if wake is not None:
            wait_ms = min(wait_ms, wake - now_ms())
        return max(0, wait_ms) / 1000
