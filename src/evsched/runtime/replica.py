"""The read replica: the same fold over every events partition, emitting nothing.

Serves reads (job state, timelines) with read-your-writes: a writer waits until the replica has
applied the offset its produce returned. It folds with the one restore path
(``runtime.projection.restore.Restorer``), following the log's end instead of stopping at a target.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from pathlib import Path
from typing import Literal

import structlog

from evsched.adapters.clock import monotonic_s
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.partition_log import KafkaPartitionLog, partition_for
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.adapters.proofs import NodeKeyring, node_keyring_from_env
from evsched.core.state import JobState, TimelineEntry
from evsched.errors import BrokerUnavailable, EvschedError
from evsched.ports import PartitionLog
from evsched.runtime.projection.projector import CommitHook, Projector
from evsched.runtime.projection.replica_restore import prepare_indexes
from evsched.runtime.projection.restore import Restorer, index_path
from evsched.settings import Settings

log = structlog.get_logger("evsched.replica")

# A partition whose fold failed is retried after this wait, doubled per failure in a row.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0

# Records per read: the replica serves reads, so it folds in moderate steps.
READ_RECORDS = 5_000
READ_WAIT_S = 0.1


class Replica:
    """Folds all partitions of ``<ns>.events`` into local indexes under ``data_dir``."""

    def __init__(
        self,
        settings: Settings,
        data_dir: Path,
        *,
        client_id: str = "evsched-replica",
        on_commit: CommitHook | None = None,
        keyring: NodeKeyring | Literal["env"] | None = "env",
    ):
        self.settings = settings
        self.topic = Topics(settings.namespace).events
        self.data_dir = data_dir
        self.client_id = client_id
        # Told what every committed batch folded (e.g. metrics), after it is in the index.
        self.on_commit = on_commit
        # The node keys proofs are checked with (adapters.proofs): those the process read once,
        # or by default the environment's, read here once for all the replica's partitions (a
        # replica without the keys of a proven log would refuse its node facts as unproven).
        self.keyring = node_keyring_from_env() if keyring == "env" else keyring
        self.projectors: dict[int, Projector] = {}
        self._log: PartitionLog | None = None
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        # Partitions whose last fold failed, with the reason: not read, retried after a wait.
        self.failing: dict[int, str] = {}
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}
        self._failed_at: dict[int, int] = {}

    async def start(self) -> None:
        count = await partition_count(
            self.settings.bootstrap, self.topic, **dict(self.settings.kafka_options)
        )
        # Missing, behind a trimmed log or of another fold: restored from the changelog first.
        prepared = await prepare_indexes(
            self.settings, self.data_dir, count, client_id=self.client_id
        )
        log = KafkaPartitionLog(self.settings, self.topic, range(count), client_id=self.client_id)
        await log.start()
        for partition in range(count):
            index = PartitionIndex(index_path(self.data_dir, partition), partition)
            self.projectors[partition] = Projector(
                index, on_commit=self.on_commit, keyring=self.keyring
            )
        self._task = self.follow(log)
        for partition, reason in prepared.refused.items():
            # Never folded from the log's start: it stays out, failing, until an operator acts.
            self.failing[partition] = f"refused: {reason}"
            self._retry_at[partition] = math.inf

    def follow(self, log: PartitionLog) -> asyncio.Task[None]:
        """Fold what ``log`` (started, reading every partition) holds past the indexes, forever."""
        self._log = log
        restorer = Restorer(log, self.projectors, on_fold_error=self._fold_failed)
        restorer.seek()
        return asyncio.create_task(self._run(restorer), name="evsched-replica")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._log is not None:
            await self._log.close()
        for projector in self.projectors.values():
            projector.index.close()
        self.projectors.clear()

    async def __aenter__(self) -> Replica:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def _run(self, restorer: Restorer) -> None:
        while True:
            self._due(restorer)
            active = [p for p in self.projectors if p not in self._retry_at]
            try:
                folded = await restorer.read_once(active, timeout_s=READ_WAIT_S) if active else 0
            except BrokerUnavailable as exc:
                log.warning("replica_fetch_failed", error=str(exc), retry_in_s=RETRY_FIRST_S)
                await asyncio.sleep(RETRY_FIRST_S)
                continue
            if not active:
                await asyncio.sleep(READ_WAIT_S)
            self._recovered()
            if folded:
                async with self._changed:
                    self._changed.notify_all()

    def _fold_failed(self, partition: int, offset: int, exc: Exception) -> None:
        """A partition's batch did not fold: that partition alone waits, then folds it again.

        The fold refuses what it cannot carry out, so this is a second line of defence: the
        partition is retried from its index's offset after a growing wait, and shows in
        ``failing`` (and the log) meanwhile. Reads of the other partitions go on.
        """
        failures = self._failures.get(partition, 0) + 1
        self._failures[partition] = failures
        wait_s = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** min(failures - 1, 16))
        self.failing[partition] = f"fold failed at offset {offset}: {exc!r}"
        log.error(
            "replica_partition_failed",
            partition=partition,
            offset=offset,
            error=repr(exc),
            failures=failures,
            retry_in_s=wait_s,
        )
        self._retry_at[partition] = monotonic_s() + wait_s
        self._failed_at[partition] = offset

    def _due(self, restorer: Restorer) -> None:
        """Failed partitions whose wait is over: read again from their indexes."""
        now = monotonic_s()
        due = [p for p, at in self._retry_at.items() if at <= now]
        for partition in due:
            del self._retry_at[partition]
        restorer.seek(due)

    def _recovered(self) -> None:
        """Failed partitions that folded past the offset they failed at run again."""
        for partition, offset in list(self._failed_at.items()):
            if partition not in self._retry_at and self.index(partition).applied_offset() >= offset:
                del self._failed_at[partition]
                self.failing.pop(partition, None)
                self._failures.pop(partition, None)
                log.info("replica_partition_recovered", partition=partition)

    # --- reads ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Started, and its fold loop has not stopped (a crashed loop serves stale reads)."""
        return self._task is not None and not self._task.done()

    async def lag(self) -> dict[int, int]:
        """Records per partition between what this replica has read and the log's end.

        Asks the broker for the end offsets (so it raises when the broker is unreachable); the
        read position is past transaction markers, which the applied offset never reaches.
        """
        reader = self._log
        if reader is None:
            raise EvschedError("the replica is not started")
        partitions = sorted(self.projectors)
        try:
            ends = await reader.end_offsets(partitions)
            return {p: max(0, ends[p] - await reader.position(p)) for p in partitions}
        except BrokerUnavailable as exc:
            raise EvschedError(f"cannot read the end offsets of {self.topic}: {exc}") from exc

    def partition_of(self, key: str) -> int:
        return partition_for(key, len(self.projectors))

    def index(self, partition: int) -> PartitionIndex:
        return self.projectors[partition].index

    async def job(self, job_id: str) -> JobState | None:
        return self.index(self.partition_of(job_id)).job(job_id)

    def timeline(self, job_id: str) -> list[TimelineEntry]:
        return self.index(self.partition_of(job_id)).timeline(job_id)

    async def wait_for(self, partition: int, offset: int, timeout_s: float = 10.0) -> None:
        """Return once ``offset`` of ``partition`` is folded; TimeoutError after ``timeout_s``."""
        deadline = monotonic_s() + timeout_s
        async with self._changed:
            while self.index(partition).applied_offset() < offset:
                remaining = deadline - monotonic_s()
                if remaining <= 0:
                    raise TimeoutError(f"replica did not reach offset {offset} of p{partition}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
