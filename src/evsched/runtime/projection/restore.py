"""One restore path: a partition's index folded from its log, up to a target offset or the end.

Every reader of the events log that keeps an index uses it: the node (a partition's index
rebuilt after a fold-version change), the API's read replica, the operator's local replica and
``evsched rebuild``. Records are read through ``ports.PartitionLog`` (read_committed: aborted
records and transaction markers are never folded, they only move the position) and folded with
the node's projector, so every index of one log equals every other at the same offset.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from evsched.adapters.clock import monotonic_s
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.proofs import NodeKeyring
from evsched.core.fold import FOLD_VERSION
from evsched.errors import IndexVersionMismatch, RestoreRefused
from evsched.ports import PartitionLog, Record
from evsched.runtime.process.offload import Offload, in_turn, made
from evsched.runtime.projection.fold_chunks import fold_chunked
from evsched.runtime.projection.projector import Folded, Projector

FETCH_RECORDS = 10_000
# How long one read waits for records while a target is not reached yet.
READ_WAIT_S = 0.5

# Called with the records folded so far, in all partitions.
Progress = Callable[[int], None]
# Called when a partition's batch could not be folded: (partition, first offset, error).
OnFoldError = Callable[[int, int, Exception], None]


def index_path(data_dir: Path, partition: int) -> Path:
    return data_dir / f"p{partition:04d}"


def swap_in(data_dir: Path, partition: int, fresh: Path) -> None:
    """Put ``fresh`` in the place of the partition's index by renames: a crash leaves one whole."""
    live = index_path(data_dir, partition)
    old = data_dir / f".p{partition:04d}.replaced"
    shutil.rmtree(old, ignore_errors=True)
    if live.exists():
        live.rename(old)
    fresh.rename(live)
    shutil.rmtree(old, ignore_errors=True)


def fresh_index(path: Path, partition: int) -> PartitionIndex:
    """An empty index at ``path``, in place of whatever a crashed restore or rebuild left there."""
    shutil.rmtree(path, ignore_errors=True)
    return PartitionIndex(path, partition)


def open_index(data_dir: Path, partition: int) -> PartitionIndex:
    """The partition's index under ``data_dir``; IndexVersionMismatch for another fold version."""
    index = PartitionIndex(index_path(data_dir, partition), partition)
    version = index.fold_version()
    if version not in (None, FOLD_VERSION):
        index.close()
        raise IndexVersionMismatch(partition, version, FOLD_VERSION)
    return index


class Restorer:
    """Folds what a PartitionLog reads into one projector per partition.

    ``batch_records`` bounds how many records a partition folds before they are written to its
    index (0: written after every read).
    """

    def __init__(
        self,
        log: PartitionLog,
        projectors: Mapping[int, Projector],
        *,
        batch_records: int = 0,
        fetch_records: int = FETCH_RECORDS,
        on_fold_error: OnFoldError | None = None,
    ) -> None:
        self.log = log
        self.projectors = projectors
        self.batch_records = batch_records
        self.fetch_records = fetch_records
        self.on_fold_error = on_fold_error
        self._pending = {p: Folded() for p in projectors}
        self._uncommitted = dict.fromkeys(projectors, 0)

    def seek(self, partitions: Collection[int] | None = None) -> None:
        """Read each partition (default: all) from the offset after its index's."""
        for partition in self.projectors if partitions is None else partitions:
            self.log.seek(partition, self.projectors[partition].next_offset)

    async def read_once(
        self,
        partitions: Collection[int],
        *,
        timeout_s: float = READ_WAIT_S,
        targets: Mapping[int, int] | None = None,
    ) -> int:
        """One read of ``partitions``, folded; records at or past a partition's target are left.

        Returns how many records were folded. A partition whose fold fails is rewound to its
        index (its batch is dropped) and handed to ``on_fold_error``; without one, it raises.
        """
        batches = await self.log.read(partitions, timeout_s, self.fetch_records)
        folded = 0
        for partition, read in batches.items():
            end = None if targets is None else targets[partition]
            records = read if end is None else [r for r in read if r.offset < end]
            if records:
                folded += await self._fold(partition, records)
        return folded

    async def _fold(self, partition: int, records: list[Record]) -> int:
        projector = self.projectors[partition]
        try:
            # In chunks: a read of thousands of records must not hold the event loop.
            await fold_chunked(projector, records, self._pending[partition])
            self._uncommitted[partition] += len(records)
            if self._uncommitted[partition] >= self.batch_records:
                self.flush([partition])
        except Exception as exc:
            self._pending[partition], self._uncommitted[partition] = Folded(), 0
            # The batch is folded again from what the index holds.
            projector.next_offset = projector.index.applied_offset() + 1
            if self.on_fold_error is None:
                raise
            self.on_fold_error(partition, records[0].offset, exc)
            return 0
        return len(records)

    def flush(self, partitions: Collection[int] | None = None) -> None:
        """Write what was folded and not yet written to the indexes."""
        for partition in self.projectors if partitions is None else partitions:
            self.projectors[partition].commit(self._pending[partition])
            self._pending[partition], self._uncommitted[partition] = Folded(), 0

    async def run_to(self, targets: Mapping[int, int], progress: Progress | None = None) -> int:
        """Fold every partition until its read position reaches its target (exclusive).

        Reads from where each index stands; returns the records folded.
        """
        self.seek()
        done = 0
        open_ = {p for p in self.projectors if await self.log.position(p) < targets[p]}
        while open_:
            done += await self.read_once(open_, targets=targets)
            if progress is not None:
                progress(done)
            open_ = {p for p in open_ if await self.log.position(p) < targets[p]}
        self.flush()
        return done


async def restore(
    log: PartitionLog,
    projectors: Mapping[int, Projector],
    targets: Mapping[int, int] | None = None,
    *,
    batch_records: int = 0,
    fetch_records: int = FETCH_RECORDS,
    progress: Progress | None = None,
) -> int:
    """Fold each partition from its index's offset up to ``targets`` (default: the log's end).

    ``log`` must be started and reading the projectors' partitions. Returns the records folded.
    """
    if targets is None:
        targets = await log.end_offsets(list(projectors))
    restorer = Restorer(log, projectors, batch_records=batch_records, fetch_records=fetch_records)
    return await restorer.run_to(targets, progress)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rebuilt:
    """A partition's index rebuilt from the log, swapped in for the old one."""

    partition: int
    old_version: int
    new_version: int
    records: int
    applied_offset: int
    seconds: float


async def rebuild_index(
    log: PartitionLog,
    data_dir: Path,
    mismatch: IndexVersionMismatch,
    until: int,
    offload: Offload = in_turn,
    *,
    keyring: NodeKeyring | None = None,
) -> Rebuilt:
    """Fold the partition's log up to ``until`` (exclusive) into a fresh index, then swap it in.

    Refuses (RestoreRefused) when the log no longer starts at offset 0: the records retention
    deleted are not in the log any more, and an index without them would lose their jobs. The
    fresh index is built aside and renamed into place: a crash leaves the old index, or none
    (which a node refolds from the log as for a new partition), never a half-built one. The
    fresh index's open and close and the renames run through ``offload`` (a node's threads).
    """
    partition = mismatch.partition
    started = monotonic_s()
    first = (await log.start_offsets([partition]))[partition]
    if first > 0 and until > 0:
        raise RestoreRefused(
            partition,
            f"its log starts at offset {first} (retention deleted what came before), so a "
            f"rebuild of its index for fold version {mismatch.expected} would lose history",
        )
    scratch = data_dir / f".p{partition:04d}.rebuilding"
    # A cancelled rebuild (the partition revoked) must not leave the fresh index open.
    opened = functools.partial(fresh_index, scratch, partition)
    index = await made(offload, opened, PartitionIndex.close)
    try:
        records = await Restorer(log, {partition: Projector(index, keyring=keyring)}).run_to(
            {partition: until}
        )
        applied = index.applied_offset()
    finally:
        await offload(index.close)
    await offload(functools.partial(swap_in, data_dir, partition, scratch))
    return Rebuilt(
        partition=partition,
        old_version=mismatch.found,
        new_version=mismatch.expected,
        records=records,
        applied_offset=applied,
        seconds=monotonic_s() - started,
    )
