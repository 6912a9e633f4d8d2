"""The operator's local replica: per-partition indexes in a directory, caught up to the log's end.

A read command first folds whatever the log holds beyond the indexes (the one restore path of
nodes and replicas, ``runtime.projection.restore``), up to the end offsets captured when it
started, then answers from RocksDB.
It waits for consumer positions rather than applied offsets: the last offset of a partition is
often a transaction marker, which no record's applied offset ever reaches.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.partition_log import KafkaPartitionLog, partition_for
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.adapters.proofs import NodeKeyring
from evsched.errors import IndexVersionMismatch
from evsched.operator.exits import ExitCode, OperatorError
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.replica_restore import prepare_indexes
from evsched.runtime.projection.restore import open_index, restore
from evsched.settings import Settings

DEFAULT_TIMEOUT_S = 60.0
FETCH_RECORDS = 10_000
# Larger fetches than a node's: catching up is throughput, not latency.
FETCH_OPTIONS = {"max_partition_fetch_bytes": 8 << 20, "fetch_max_bytes": 64 << 20}
_PARTITION_DIR = re.compile(r"p(\d{4})")

# Called with (records folded so far, records to fold in all) while catching up.
Progress = Callable[[int, int], None]


@dataclass(slots=True)
class LocalIndex:
    """Open indexes of every events partition; ids route to partitions as Kafka's producer does."""

    indexes: dict[int, PartitionIndex] = field(default_factory=dict)
    # The node keys its folds check proofs with (read once per command); None: none checked.
    keyring: NodeKeyring | None = field(default=None, repr=False)

    @property
    def partitions(self) -> int:
        return len(self.indexes)

    def partition_of(self, key: str) -> int:
        return partition_for(key, self.partitions)

    def index_of(self, key: str) -> PartitionIndex:
        return self.indexes[self.partition_of(key)]

    def applied_offsets(self) -> dict[int, int]:
        return {p: index.applied_offset() for p, index in sorted(self.indexes.items())}

    def close(self) -> None:
        for index in self.indexes.values():
            index.close()
        self.indexes.clear()


def open_offline(data_dir: Path) -> LocalIndex:
    """The indexes already in ``data_dir``, as they are (no Kafka); NOT_FOUND without any."""
    found = sorted(
        int(m[1])
        for p in (data_dir.iterdir() if data_dir.is_dir() else [])
        if (m := _PARTITION_DIR.fullmatch(p.name))
    )
    if not found or found != list(range(len(found))):
        raise OperatorError(
            ExitCode.NOT_FOUND,
            f"no replica indexes p0000..pNNNN under {data_dir} (run online once)",
        )
    return LocalIndex({p: _open(data_dir, p) for p in found})


def _open(data_dir: Path, partition: int) -> PartitionIndex:
    try:
        return open_index(data_dir, partition)
    except IndexVersionMismatch as exc:
        raise OperatorError(
            ExitCode.UNAVAILABLE, f"{exc}; or delete {data_dir} and let it refill"
        ) from exc


async def catch_up(
    settings: Settings,
    data_dir: Path,
    *,
    at_least: Mapping[int, int] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
    keyring: NodeKeyring | None = None,
) -> LocalIndex:
    """The replica in ``data_dir`` with every partition folded up to the log end seen at start;
    its folds check proofs with ``keyring``."""
    topic = Topics(settings.namespace).events
    count = await partition_count(settings.bootstrap, topic, **dict(settings.kafka_options))
    async with _events_log(settings, range(count)) as log:
        # One reader for both: its offsets plan the indexes' restore, then it folds the rest.
        prepared = await prepare_indexes(
            settings, data_dir, count, client_id="evsched-operator", events=log
        )
        if prepared.refused:
            details = "; ".join(
                f"partition {p}: {why}" for p, why in sorted(prepared.refused.items())
            )
            raise OperatorError(ExitCode.UNAVAILABLE, details)
        local = LocalIndex({p: _open(data_dir, p) for p in range(count)}, keyring=keyring)
        try:
            await _fold_to_end(
                log, local, at_least=dict(at_least or {}), timeout_s=timeout_s, progress=progress
            )
        except BaseException:
            local.close()
            raise
    return local


async def refresh(
    settings: Settings,
    local: LocalIndex,
    *,
    at_least: Mapping[int, int] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: Progress | None = None,
) -> None:
    """Fold ``local`` up to the log end seen now, and past every ``at_least`` offset.

    ``at_least`` maps partitions to offsets that must be folded too: a write just acknowledged,
    which read_committed end offsets may not show yet behind another producer's transaction.
    """
    async with _events_log(settings, local.indexes) as log:
        await _fold_to_end(
            log, local, at_least=dict(at_least or {}), timeout_s=timeout_s, progress=progress
        )


def _events_log(settings: Settings, partitions: Iterable[int]) -> KafkaPartitionLog:
    topic = Topics(settings.namespace).events
    return KafkaPartitionLog(
        settings, topic, partitions, client_id="evsched-operator", **FETCH_OPTIONS
    )


async def _fold_to_end(
    log: KafkaPartitionLog,
    local: LocalIndex,
    *,
    at_least: dict[int, int],
    timeout_s: float,
    progress: Progress | None,
) -> None:
    projectors = {p: Projector(index, keyring=local.keyring) for p, index in local.indexes.items()}
    ends = await log.end_offsets(list(projectors))
    targets = {p: max(end, at_least.get(p, -1) + 1) for p, end in ends.items()}
    total = sum(max(0, targets[p] - projector.next_offset) for p, projector in projectors.items())
    report = None if progress is None else (lambda done: progress(min(done, total), total))
    try:
        async with asyncio.timeout(timeout_s):
            await restore(log, projectors, targets, fetch_records=FETCH_RECORDS, progress=report)
    except TimeoutError as exc:
        raise OperatorError(
            ExitCode.UNAVAILABLE,
            f"the replica did not reach the log end {targets} within {timeout_s:g} s",
        ) from exc
