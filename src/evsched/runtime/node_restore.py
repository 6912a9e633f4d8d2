"""A node's index restores: a partition whose local index cannot be used as it is.

An index that is missing while the changelog holds a snapshot, of another fold version, or behind
the events log's start is restored from the changelog (``runtime.changelog_restore``), or, for
another fold version over a whole log, refolded from the log. Each restore runs in the background
(a rebalance must not wait for it) with readers of its own, while the partition stays paused at
the group consumer and RESTORING in its lifecycle. When no source holds the partition's whole
history the restore is refused loudly and tried again only rarely: an operator has to act.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any, Protocol

from evsched.adapters.clock import monotonic_s
from evsched.adapters.index import PartitionIndex
from evsched.adapters.kafka_events import KafkaPartitionLog
from evsched.core.fold import FOLD_VERSION
from evsched.errors import IndexVersionMismatch, RestoreRefused
from evsched.ports import PartitionLog
from evsched.runtime.changelog import RESTORE_FETCH, Meta, latest_meta
from evsched.runtime.changelog_restore import (
    Action,
    LocalIndex,
    OpenPlan,
    local_index,
    plan_open,
    restore_partition,
    seed,
)
from evsched.runtime.health import NodeHealth
from evsched.runtime.partition import OwnedPartition
from evsched.runtime.restore import Rebuilt, index_path, rebuild_index
from evsched.settings import Settings

# A partition whose index cannot be rebuilt (its log was trimmed) is tried again this rarely:
# only an operator can fix it, and each try logs the error again.
REFUSED_RETRY_S = 600.0


class Committed(Protocol):
    """Where the group's offset and the log's start of a partition stand (the group consumer)."""

    async def committed(self, partition: int) -> int | None: ...

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]: ...


# What a finished restore logs.
Details = dict[str, Any]

# Called once a partition's index was rebuilt and swapped in.
Done = Callable[[Any, int], Awaitable[None]]
# A reader of one partition of the events topic, not started yet.
OpenLog = Callable[[int], PartitionLog]


def kafka_reader(settings: Settings, topic: str, client_id: str) -> OpenLog:
    """Readers of one partition of ``topic`` each, named after the node's ``client_id``."""

    def open_log(partition: int) -> PartitionLog:
        return KafkaPartitionLog(
            settings,
            topic,
            [partition],
            client_id=f"{client_id}-restore-p{partition}",
            **RESTORE_FETCH,
        )

    return open_log


class IndexRestores:
    """The restores under way, one task per partition."""

    def __init__(
        self,
        open_log: OpenLog,
        *,
        open_state: OpenLog,
        data_dir: Path,
        health: NodeHealth,
        counter: Any,
        log: Any,
        done: Done,
    ) -> None:
        self.open_log = open_log  # a reader of one events partition
        self.open_state = open_state  # a reader of one changelog partition
        self.data_dir = data_dir
        self.health = health
        self.counter = counter  # evsched_node_index_rebuilds, or None without metrics
        self.log = log
        self.done = done
        self.tasks: dict[int, asyncio.Task[None]] = {}

    async def plan(self, index: PartitionIndex, log_start: int) -> OpenPlan:
        """What an opening partition does with its (open) local index."""
        local = LocalIndex(applied_offset=index.applied_offset(), fold_version=index.fold_version())
        return await self._plan(index.partition, local, log_start)

    async def _plan(self, partition: int, local: LocalIndex, log_start: int) -> OpenPlan:
        state = self.open_state(partition)
        await state.start()
        try:
            meta = await latest_meta(state, partition)
        finally:
            await state.close()
        return plan_open(local, log_start=log_start, meta=meta)

    async def seed(self, owner: OwnedPartition) -> None:
        """Write the owner's whole index to the changelog, which does not hold it yet."""
        assert owner.changelog is not None
        state = self.open_state(owner.partition)
        await state.start()
        try:
            sent = await seed(state, owner.outbox, owner.quarantine, owner.changelog, owner.index)
        finally:
            await state.close()
        self.log.info(
            "partition_changelog_seeded",
            partition=owner.partition,
            records=sent,
            applied_offset=owner.index.applied_offset(),
        )

    def start(self, consumer: Committed, partition: int, why: str) -> None:
        """Restore the partition's index in the background, then call ``done``."""
        self.health.restoring(partition, why)
        self.tasks[partition] = asyncio.create_task(
            self._run(consumer, partition), name=f"evsched-restore-{partition}"
        )

    async def cancel(self, partition: int) -> None:
        if (task := self.tasks.pop(partition, None)) is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self, consumer: Committed, partition: int) -> None:
        try:
            source, details = await self._restore(consumer, partition)
        except RestoreRefused as exc:
            self._refused(exc)
            return
        except Exception as exc:
            failures = self.health.failed(partition, f"index restore failed: {exc!r}")
            self.log.warning(
                "partition_index_rebuild_failed",
                partition=partition,
                error=repr(exc),
                failures=failures,
            )
            return
        finally:
            self.tasks.pop(partition, None)
        if source is not None:
            self.log.info(f"partition_index_{source}", partition=partition, **details)
            if self.counter is not None:
                self.counter.labels("fold_version" if source == "rebuilt" else "changelog").inc()
        await self.done(consumer, partition)

    async def _restore(self, consumer: Committed, partition: int) -> tuple[str | None, Details]:
        """Restore as the plan says: ("restored" | "rebuilt" | None, what to log)."""
        started = monotonic_s()
        local = local_index(self.data_dir, partition)
        log_start = (await consumer.start_offsets([partition]))[partition]
        plan = await self._plan(partition, local, log_start)
        if plan.action is Action.REFUSE:
            raise RestoreRefused(partition, plan.reason)
        if plan.action is Action.USE_LOCAL:
            return None, {}
        if plan.action is Action.RESTORE:
            meta = await self._from_changelog(partition, log_start)
            return "restored", {
                "applied_offset": meta.applied_offset,
                "seconds": round(monotonic_s() - started, 3),
            }
        assert local.fold_version is not None
        mismatch = IndexVersionMismatch(partition, local.fold_version, FOLD_VERSION)
        rebuilt = await self._rebuild(consumer, mismatch)
        return "rebuilt", {
            "old_version": rebuilt.old_version,
            "new_version": rebuilt.new_version,
            "records": rebuilt.records,
            "applied_offset": rebuilt.applied_offset,
            "seconds": round(rebuilt.seconds, 3),
        }

    async def _from_changelog(self, partition: int, log_start: int) -> Meta:
        state = self.open_state(partition)
        await state.start()
        try:
            return await restore_partition(state, self.data_dir, partition, log_start=log_start)
        finally:
            await state.close()

    async def _rebuild(self, consumer: Committed, mismatch: IndexVersionMismatch) -> Rebuilt:
        partition = mismatch.partition
        # Up to the group's offset, not the log's end: records past it may carry effects not
        # published yet, which the partition's owner must fold (and send) itself.
        until = await consumer.committed(partition) or 0
        reader = self.open_log(partition)
        await reader.start()
        try:
            return await rebuild_index(reader, self.data_dir, mismatch, until)
        finally:
            await reader.close()

    def _refused(self, exc: RestoreRefused) -> None:
        partition = exc.partition
        fix = (
            f"restore {index_path(self.data_dir, partition)} from a backup made by this fold "
            "version, or the <ns>.state changelog, or the events from an archive; nothing "
            "starts from the log's start on its own"
        )
        self.health.failed(
            partition, f"its index cannot be rebuilt: {exc.reason}; {fix}", REFUSED_RETRY_S
        )
        self.log.error(
            "partition_index_rebuild_refused",
            partition=partition,
            reason=exc.reason,
            fix=fix,
            retry_in_s=REFUSED_RETRY_S,
        )
