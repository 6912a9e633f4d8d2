"""Rebuilds: the log folded into fresh indexes, partitions in parallel processes, then digested.

Each partition is fetched in large batches (a rebuild is throughput, not latency) and folded
by the one restore path (``runtime.projection.restore``, the node's projector), in a process of its
own: the fold is CPU-bound Python, so processes, not threads or tasks, are what use more cores.
Measured, the size of the index writes hardly matters (``docs/bench-log.md``);
``batch_records`` bounds the memory a batch holds.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evsched.adapters.archive.partition_log import ArchivePartitionLog
from evsched.adapters.clock import monotonic_s
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.kafka.topics import Topics
from evsched.adapters.proofs import NodeKeyring
from evsched.core.fold import FOLD_VERSION
from evsched.operator.archive_history import ArchiveThenLog
from evsched.ports import PartitionLog
from evsched.runtime.process.gc_policy import tune_collector
from evsched.runtime.projection.changelog import restore_into
from evsched.runtime.projection.changelog_restore import LocalIndex, refusal
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import restore
from evsched.settings import Settings

BATCH_RECORDS = 10_000
FETCH_RECORDS = 20_000
# Fetch far more per round trip than a node does; a rebuild is pure throughput.
FETCH_OPTIONS = {
    "max_partition_fetch_bytes": 32 << 20,
    "fetch_max_bytes": 64 << 20,
    "fetch_max_wait_ms": 100,
}

# Records folded so far, per partition, shared with the worker processes.
_counts: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionPlan:
    """Fold offsets up to ``until`` (inclusive; -1: none) of one partition into ``directory``."""

    bootstrap: str
    namespace: str
    partition: int
    until: int
    directory: Path
    batch_records: int = BATCH_RECORDS
    check_crcs: bool = True
    # Read the partition's archive (``evsched archive --to``) first, then the log after it.
    archive: Path | None = None
    # The node keys the command read once (None: no proof is checked), passed to the workers.
    keyring: NodeKeyring | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionResult:
    """What one partition's rebuild did, and the digest of the index it made."""

    partition: int
    events: int
    applied_offset: int
    digest: str
    # On the system-wide monotonic clock, comparable across the worker processes.
    fold_started_at: float
    fold_ended_at: float
    # CPU seconds the process spent folding (fetch, decode, fold, write; RocksDB's threads too).
    fold_cpu_s: float
    digest_s: float
    # "log": folded from offset 0; "changelog+log": the log is trimmed, so the changelog's
    # snapshot was loaded and the log's tail folded on top.
    source: str = "log"
    snapshot_offset: int | None = None
    refused: str | None = None  # why nothing could be rebuilt (a trimmed log, no snapshot)

    @property
    def fold_s(self) -> float:
        return self.fold_ended_at - self.fold_started_at


def plan_settings(plan: PartitionPlan) -> Settings:
    """Settings in a worker process: TLS/SASL options come from its (inherited) environment."""
    base = Settings.from_env()
    return Settings(
        bootstrap=plan.bootstrap, namespace=plan.namespace, kafka_options=base.kafka_options
    )


def rebuild_one(
    plan: PartitionPlan, report: Callable[[int], None] | None = None
) -> PartitionResult:
    """Fold one partition into a fresh index at ``plan.directory`` and digest it."""
    index = PartitionIndex(plan.directory, plan.partition)
    try:
        started, cpu_started = monotonic_s(), time.process_time()
        folded = asyncio.run(_fold_partition(plan, index, report)) if plan.until >= 0 else None
        folded_at, cpu_s = monotonic_s(), time.process_time() - cpu_started
        digest = index.digest()
        return PartitionResult(
            partition=plan.partition,
            events=0 if folded is None else folded.events,
            applied_offset=index.applied_offset(),
            digest=digest,
            fold_started_at=started,
            fold_ended_at=folded_at,
            fold_cpu_s=cpu_s,
            digest_s=monotonic_s() - folded_at,
            source="log" if folded is None else folded.source,
            snapshot_offset=None if folded is None else folded.snapshot_offset,
            refused=None if folded is None else folded.refused,
        )
    finally:
        index.close()


@dataclass(frozen=True, slots=True)
class _Folded:
    events: int
    source: str = "log"
    snapshot_offset: int | None = None
    refused: str | None = None


async def _fold_partition(
    plan: PartitionPlan, index: PartitionIndex, report: Callable[[int], None] | None
) -> _Folded:
    """Fold the log into ``index``: after an archive, or a trimmed log on the changelog's state."""
    settings, partition = plan_settings(plan), plan.partition
    topic = Topics(plan.namespace).events
    kafka_log = KafkaPartitionLog(
        settings,
        topic,
        [partition],
        client_id=f"evsched-rebuild-p{partition}",
        check_crcs=plan.check_crcs,
        **FETCH_OPTIONS,
    )
    log: PartitionLog = kafka_log
    if plan.archive is not None:
        log = ArchiveThenLog(ArchivePartitionLog(plan.archive, topic), kafka_log)
    await log.start()
    try:
        snapshot = None
        start = (await kafka_log.start_offsets([partition]))[partition]
        if start > 0 and plan.archive is None:
            snapshot, refused = await _from_changelog(settings, plan, index, start)
            if refused is not None:
                return _Folded(0, "changelog+log", snapshot, refused)
        events = await restore(
            log,
            {partition: Projector(index, keyring=plan.keyring)},
            {partition: plan.until + 1},
            batch_records=plan.batch_records,
            fetch_records=FETCH_RECORDS,
            progress=report,
        )
    finally:
        await log.close()
    return _Folded(events, "log" if snapshot is None else "changelog+log", snapshot)


async def _from_changelog(
    settings: Settings, plan: PartitionPlan, index: PartitionIndex, log_start: int
) -> tuple[int | None, str | None]:
    """Load the changelog's snapshot into ``index``: (its offset, or why it cannot be used)."""
    partition = plan.partition
    state = KafkaPartitionLog(
        settings,
        Topics(plan.namespace).state,
        [partition],
        client_id=f"evsched-rebuild-state-p{partition}",
        **FETCH_OPTIONS,
    )
    async with state:
        meta = await restore_into(state, partition, index)
    if meta is None or not meta.covers(FOLD_VERSION, log_start):
        return None, refusal(LocalIndex(), log_start, meta)
    if meta.applied_offset > plan.until:
        return meta.applied_offset, (
            f"the changelog's snapshot (offset {meta.applied_offset}) is past the offset to "
            f"rebuild to ({plan.until}) and the log before it is trimmed: compare again once "
            "the node has caught up (or is stopped)"
        )
    return meta.applied_offset, None


def _init_worker(counts: Any) -> None:
    global _counts  # noqa: PLW0603 - the one way to hand a shared array to pool workers
    _counts = counts
    tune_collector()


def _rebuild_in_worker(plan: PartitionPlan) -> PartitionResult:
    def report(events: int) -> None:
        _counts[plan.partition] = events

    return rebuild_one(plan, report)


def fold_rate(results: Sequence[PartitionResult]) -> int:
    """Events folded per second of wall time, from the first fold's start to the last one's end.

    Process start-up and the digests after each fold are not counted; fetching from Kafka,
    decoding, folding and writing RocksDB are.
    """
    events = sum(r.events for r in results)
    folding = [r for r in results if r.events]
    if not folding:
        return 0
    span = max(r.fold_ended_at for r in folding) - min(r.fold_started_at for r in folding)
    return round(events / max(span, 1e-9))


def cpu_rate(results: Sequence[PartitionResult]) -> int:
    """Events folded per CPU second, summed over the processes: what one idle core would do."""
    cpu = sum(r.fold_cpu_s for r in results)
    return round(sum(r.events for r in results) / cpu) if cpu > 0 else 0


def rebuild_all(
    plans: Sequence[PartitionPlan],
    *,
    processes: int,
    on_progress: Callable[[dict[int, int]], None] | None = None,
) -> list[PartitionResult]:
    """Rebuild every planned partition, ``processes`` at a time (1: in this process)."""
    if processes <= 1 or len(plans) <= 1:
        results = []
        for plan in plans:
            results.append(rebuild_one(plan, _reporter(plan.partition, on_progress)))
        return results
    context = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    size = max(p.partition for p in plans) + 1
    counts = context.Array("q", size, lock=False)
    with ProcessPoolExecutor(
        max_workers=min(processes, len(plans)),
        mp_context=context,
        initializer=_init_worker,
        initargs=(counts,),
    ) as pool:
        futures = [pool.submit(_rebuild_in_worker, plan) for plan in plans]
        _watch(futures, counts, on_progress)
        return sorted((f.result() for f in futures), key=lambda r: r.partition)


def _reporter(
    partition: int, on_progress: Callable[[dict[int, int]], None] | None
) -> Callable[[int], None] | None:
    if on_progress is None:
        return None
    return lambda events: on_progress({partition: events})


def _watch(
    futures: list[Future[PartitionResult]],
    counts: Any,
    on_progress: Callable[[dict[int, int]], None] | None,
) -> None:
    """Until every future is done, hand the shared counts to ``on_progress`` now and then."""
    pending = set(futures)
    while pending:
        _, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
        if on_progress is not None:
            on_progress(dict(enumerate(counts)))
