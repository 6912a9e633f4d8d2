"""A node's index rebuilds: a partition indexed by another fold version, refolded from the log.

Each rebuild runs in the background (a rebalance must not wait for it) with a reader of its
own, while the partition stays paused at the group consumer and RESTORING in its lifecycle.
When the log no longer holds the partition's whole history the rebuild is refused loudly and
tried again only rarely: an operator has to act.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from evsched.adapters.kafka_events import KafkaPartitionLog
from evsched.errors import IndexVersionMismatch, RestoreRefused
from evsched.ports import PartitionLog
from evsched.runtime.health import NodeHealth
from evsched.runtime.restore import Rebuilt, index_path, rebuild_index
from evsched.settings import Settings

# A partition whose index cannot be rebuilt (its log was trimmed) is tried again this rarely:
# only an operator can fix it, and each try logs the error again.
REFUSED_RETRY_S = 600.0


class Committed(Protocol):
    """Where the group's offset of a partition stands (the node's group consumer)."""

    async def committed(self, partition: int) -> int | None: ...


# Called once a partition's index was rebuilt and swapped in.
Done = Callable[[Any, int], Awaitable[None]]
# A reader of one partition of the events topic, not started yet.
OpenLog = Callable[[int], PartitionLog]


def kafka_reader(settings: Settings, topic: str, client_id: str) -> OpenLog:
    """Readers of one partition of ``topic`` each, named after the node's ``client_id``."""

    def open_log(partition: int) -> PartitionLog:
        return KafkaPartitionLog(
            settings, topic, [partition], client_id=f"{client_id}-restore-p{partition}"
        )

    return open_log


class IndexRestores:
    """The rebuilds under way, one task per partition."""

    def __init__(
        self,
        open_log: OpenLog,
        *,
        data_dir: Path,
        health: NodeHealth,
        counter: Any,
        log: Any,
        done: Done,
    ) -> None:
        self.open_log = open_log
        self.data_dir = data_dir
        self.health = health
        self.counter = counter  # evsched_node_index_rebuilds, or None without metrics
        self.log = log
        self.done = done
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def start(self, consumer: Committed, mismatch: IndexVersionMismatch) -> None:
        """Rebuild the partition's index from the log in the background, then call ``done``."""
        partition = mismatch.partition
        self.health.restoring(
            partition,
            f"rebuilding its index from the log (fold version {mismatch.found} -> "
            f"{mismatch.expected})",
        )
        self.tasks[partition] = asyncio.create_task(
            self._run(consumer, mismatch), name=f"evsched-restore-{partition}"
        )

    async def cancel(self, partition: int) -> None:
        if (task := self.tasks.pop(partition, None)) is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self, consumer: Committed, mismatch: IndexVersionMismatch) -> None:
        partition = mismatch.partition
        try:
            rebuilt = await self._rebuild(consumer, mismatch)
        except RestoreRefused as exc:
            self._refused(exc)
            return
        except Exception as exc:
            failures = self.health.failed(partition, f"index rebuild failed: {exc!r}")
            self.log.warning(
                "partition_index_rebuild_failed",
                partition=partition,
                error=repr(exc),
                failures=failures,
            )
            return
        finally:
            self.tasks.pop(partition, None)
        self.log.info(
            "partition_index_rebuilt",
            partition=partition,
            old_version=rebuilt.old_version,
            new_version=rebuilt.new_version,
            records=rebuilt.records,
            applied_offset=rebuilt.applied_offset,
            seconds=round(rebuilt.seconds, 3),
        )
        if self.counter is not None:
            self.counter.labels("fold_version").inc()
        await self.done(consumer, partition)

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
            "version, or delete it to start the partition from what the log still holds "
            "(losing the jobs whose records are gone)"
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
