"""A node's index restores: a partition whose local index cannot be used as it is.

An index that is missing while the changelog holds a snapshot, of another fold version, or behind
the events log's start is restored from the changelog (``runtime.projection.changelog_restore``),
or, for another fold version over a whole log, refolded from the log. Each restore runs in the
background
(a rebalance must not wait for it) with readers of its own, while the partition stays paused at
the group consumer and RESTORING in its lifecycle. When no source holds the partition's whole
history the restore is refused loudly and tried again only rarely: an operator has to act.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from evsched.adapters.clock import monotonic_s
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.proofs import NodeKeyring
from evsched.core.fold import FOLD_VERSION
from evsched.errors import IndexVersionMismatch, RestoreRefused
from evsched.ports import PartitionLog
from evsched.runtime.node.health import NodeHealth
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.projection.changelog import META_FORMAT, RESTORE_FETCH, latest_meta
from evsched.runtime.projection.changelog_restore import (
    Action,
    LocalIndex,
    OpenPlan,
    local_index,
    plan_open,
    restore_partition,
    seed,
)
from evsched.runtime.projection.index_threads import IndexThreads
from evsched.runtime.projection.restore import Rebuilt, index_path, rebuild_index
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

# Called once a partition's index was rebuilt and swapped in, with the plan to open it by (None:
# plan again).
Done = Callable[[Any, int, OpenPlan | None], Awaitable[None]]
# A reader of chosen partitions of a topic, not started yet.
OpenLog = Callable[[Collection[int]], PartitionLog]


def kafka_reader(settings: Settings, topic: str, client_id: str) -> OpenLog:
    """Readers of chosen partitions of ``topic``, named after the node's ``client_id``."""

    def open_log(partitions: Collection[int]) -> PartitionLog:
        return KafkaPartitionLog(
            settings,
            topic,
            partitions,
            client_id=f"{client_id}-restore-p{'-'.join(map(str, sorted(partitions)))}",
            **RESTORE_FETCH,
        )

    return open_log


@contextlib.asynccontextmanager
async def _reading(log: PartitionLog) -> AsyncIterator[PartitionLog]:
    await log.start()
    try:
        yield log
    finally:
        await log.close()


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
        threads: IndexThreads,
        keyring: NodeKeyring | None,
    ) -> None:
        self.open_log = open_log  # a reader of events partitions
        self.open_state = open_state  # a reader of changelog partitions
        self.data_dir = data_dir
        self.health = health
        self.counter = counter  # evsched_node_index_rebuilds, or None without metrics
        self.log = log
        self.done = done
        self.threads = threads  # the node's: each partition's index calls in order, off the loop
        self.keyring = keyring  # the node's keys: a rebuild judges proofs as the node does
        self.tasks: dict[int, asyncio.Task[None]] = {}

    async def plans(
        self, consumer: Committed, indexes: Sequence[PartitionIndex]
    ) -> list[OpenPlan | BaseException]:
        """Each index's plan against the log's start and the changelog, or why none was made
        (the node's open then closes that index)."""
        if not indexes:
            return []
        try:
            starts = await consumer.start_offsets([i.partition for i in indexes])
            return await self._plans(indexes, starts)
        except Exception as exc:
            return [exc for _ in indexes]

    async def _plans(
        self, indexes: Sequence[PartitionIndex], starts: Mapping[int, int]
    ) -> list[OpenPlan | BaseException]:
        """What each opening partition does with its (open) local index: one changelog reader
        for all of them, each one's newest meta read in turn (an error is that index's plan)."""
        plans: list[OpenPlan | BaseException] = []
        async with _reading(self.open_state([i.partition for i in indexes])) as state:
            for index in indexes:
                local = LocalIndex(
                    applied_offset=index.applied_offset(), fold_version=index.fold_version()
                )
                try:
                    meta = await latest_meta(state, index.partition)
                except Exception as exc:
                    plans.append(exc)
                    continue
                plan = plan_open(local, log_start=starts[index.partition], meta=meta, owner=True)
                plans.append(plan)
        return plans

    async def seed(self, owner: OwnedPartition) -> None:
        """Write the owner's whole index to the changelog, which does not hold it yet."""
        assert owner.changelog is not None
        async with _reading(self.open_state([owner.partition])) as state:
            sent = await seed(state, owner.outbox, owner.quarantine, owner.changelog, owner.index)
        self.log.info(
            "partition_changelog_seeded",
            partition=owner.partition,
            records=sent,
            applied_offset=owner.index.applied_offset(),
        )

    def start(
        self, consumer: Committed, partition: int, why: str, plan: OpenPlan | None = None
    ) -> None:
        """Restore the partition's index in the background, then call ``done``.

        ``plan``: what opening the partition just planned; None (an index of another fold
        version, which does not open) plans against the changelog first.
        """
        self.health.restoring(partition, why)
        self.tasks[partition] = asyncio.create_task(
            self._run(consumer, partition, plan), name=f"evsched-restore-{partition}"
        )

    async def cancel(self, partition: int) -> None:
        if (task := self.tasks.pop(partition, None)) is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self, consumer: Committed, partition: int, plan: OpenPlan | None) -> None:
        try:
            source, details = await self._restore(consumer, partition, plan)
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
        # A snapshot just loaded is what the changelog holds: open it as it is, nothing to seed
        # (unless it was of an older format, which a node does not write on from).
        plan = None
        if source == "restored":
            plan = OpenPlan(Action.USE_LOCAL, seed=details["changelog_format"] != META_FORMAT)
        await self.done(consumer, partition, plan)

    async def _restore(
        self, consumer: Committed, partition: int, plan: OpenPlan | None
    ) -> tuple[str | None, Details]:
        """Restore as the plan says: ("restored" | "rebuilt" | None, what to log)."""
        started = monotonic_s()
        local = await self.threads.run(
            partition, functools.partial(local_index, self.data_dir, partition)
        )
        log_start = (await consumer.start_offsets([partition]))[partition]
        if plan is None or plan.action is Action.RESTORE:
            # One changelog reader for the plan and the restore it may call for.
            async with _reading(self.open_state([partition])) as state:
                if plan is None:
                    meta = await latest_meta(state, partition)
                    plan = plan_open(local, log_start=log_start, meta=meta, owner=True)
                if plan.action is Action.RESTORE:
                    meta = await restore_partition(
                        state,
                        self.data_dir,
                        partition,
                        log_start=log_start,
                        offload=self.threads.offload(partition),
                    )
                    return "restored", {
                        "applied_offset": meta.applied_offset,
                        "changelog_format": meta.format,
                        "seconds": round(monotonic_s() - started, 3),
                    }
        if plan.action is Action.REFUSE:
            raise RestoreRefused(partition, plan.reason)
        if plan.action is Action.USE_LOCAL:
            return None, {}
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

    async def _rebuild(self, consumer: Committed, mismatch: IndexVersionMismatch) -> Rebuilt:
        partition = mismatch.partition
        # Up to the group's offset, not the log's end: records past it may carry effects not
        # published yet, which the partition's owner must fold (and send) itself.
        until = await consumer.committed(partition) or 0
        async with _reading(self.open_log([partition])) as reader:
            offload = self.threads.offload(partition)
            return await rebuild_index(
                reader, self.data_dir, mismatch, until, offload, keyring=self.keyring
            )

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
