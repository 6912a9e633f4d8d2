"""The archiver: the events log copied, partition by partition, into rolling history files.

A file is sealed once it holds ``Roll.records`` records or ``Roll.payload_bytes`` bytes of keys
and values, whichever comes first. Both depend only on the records, so the files of a range are
the same whenever, and however many times, it is archived. Records not yet in a sealed file go
to a tail file (after ``Roll.tail_s`` of wall time, and when the archiver stops); the next run
reads that range again and replaces the tail, so tails never change where files roll.

Reading is read_committed through ``ports.PartitionLog``: aborted records and transaction
markers are never archived; their offsets are the gaps between and inside files.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from evsched.adapters.archive.files import (
    ArchiveError,
    ArchiveFile,
    FileWriter,
    covering,
    listed,
    read_manifest,
    seal,
    tidy,
    write_manifest,
)
from evsched.adapters.archive.history_file import LoggedEvent
from evsched.ports import Clock, PartitionLog, Record

log = structlog.get_logger("evsched.archive")

FETCH_RECORDS = 10_000
READ_WAIT_S = 0.5


@dataclass(frozen=True, slots=True, kw_only=True)
class Roll:
    """When a file is sealed, and how long records may wait before a tail file shows them."""

    records: int = 50_000
    payload_bytes: int = 64 << 20
    tail_s: float = 60.0


@dataclass(slots=True)
class _Partition:
    """One partition's progress: the file being written and the tail already on disk."""

    tail_last: int = -1  # the last offset of the tail that starts where the open file starts
    writer: FileWriter | None = None
    opened_at: float = 0.0


@dataclass(slots=True)
class ArchiveState:
    """What the archiver did so far, for its metrics and its report."""

    archived_last: dict[int, int] = field(default_factory=dict)
    files: list[ArchiveFile] = field(default_factory=list)


OnFile = Callable[[ArchiveFile, int], None]


class Archiver:
    """Archives ``partitions`` of ``namespace`` read from ``log`` into ``root``."""

    def __init__(
        self,
        log: PartitionLog,
        root: Path,
        *,
        namespace: str,
        partitions: Collection[int],
        clock: Clock,
        roll: Roll = Roll(),
        on_file: OnFile | None = None,
    ) -> None:
        self.log = log
        self.root = root
        self.namespace = namespace
        self.partitions = sorted(partitions)
        self.clock = clock
        self.roll = roll
        self.on_file = on_file
        self.state = ArchiveState()
        self._parts: dict[int, _Partition] = {}

    async def open(self, *, accept_gap: bool = False) -> dict[int, int]:
        """Check the manifest, tidy each partition and seek to where it resumes; those offsets.

        Raises ArchiveError when the log no longer holds the next offset to archive (retention
        deleted it while no archiver ran), unless ``accept_gap``.
        """
        self._check_manifest()
        starts = await self.log.start_offsets(self.partitions)
        ends = await self.log.end_offsets(self.partitions)
        resumed: dict[int, int] = {}
        for p in self.partitions:
            for path in tidy(self.root, p):
                log.info("archive_leftover_deleted", partition=p, path=str(path))
            resumed[p], self.state.archived_last[p], tail_last = self._resume(
                p, starts[p], ends[p], accept_gap
            )
            self._parts[p] = _Partition(tail_last=tail_last)
            self.log.seek(p, resumed[p])
        return resumed

    def _check_manifest(self) -> None:
        manifest = read_manifest(self.root)
        count = max(self.partitions, default=-1) + 1
        if manifest is not None and manifest.get("namespace") != self.namespace:
            raise ArchiveError(
                f"{self.root} archives namespace {manifest.get('namespace')!r}, "
                f"not {self.namespace!r}"
            )
        if manifest is None or int(str(manifest.get("partitions", 0))) < count:
            write_manifest(self.root, self.namespace, count)

    def _resume(
        self, partition: int, start: int, end: int, accept_gap: bool
    ) -> tuple[int, int, int]:
        """The offset to read from, the last archived one (-1: none), and the last of the tail
        that is read again (-1: none)."""
        files = covering(listed(self.root, partition))
        sealed = [f for f in files if not f.tail]
        tail = files[-1] if files and files[-1].tail else None
        if not files:
            if start > 0:
                log.warning("archive_starts_after_zero", partition=partition, log_start=start)
            return start, -1, -1
        next_offset = sealed[-1].last + 1 if sealed else files[0].first
        tail_last = -1
        if tail is not None and start > tail.first:
            # Retention deleted part of the tail's range: it cannot be read again, so it stays.
            log.warning("archive_tail_kept", partition=partition, path=str(seal(tail).path))
            next_offset = tail.last + 1
        elif tail is not None:
            # A tail is archived, but its range is read again so it rolls where it would have.
            next_offset, tail_last = tail.first, tail.last
        archived = files[-1].last
        if archived >= end:
            raise ArchiveError(
                f"partition {partition}: the archive holds offset {archived} but the log ends at "
                f"{end}: is {self.root} the archive of another topic?"
            )
        if start > next_offset and not accept_gap:
            raise ArchiveError(
                f"partition {partition}: the archive continues at offset {next_offset} but the "
                f"log now starts at {start}: offsets {next_offset}..{start - 1} are in neither "
                "(unless they were only transaction markers); add --accept-gap to go on from "
                f"{start}"
            )
        return max(next_offset, start), archived, tail_last

    async def step(self, *, targets: Mapping[int, int] | None = None) -> int:
        """One read of every partition still short of its target, archived; records written."""
        wanted = [p for p in self.partitions if targets is None or await self._short(p, targets)]
        if not wanted:
            return 0
        batches = await self.log.read(wanted, READ_WAIT_S, FETCH_RECORDS)
        written = 0
        for p, records in batches.items():
            end = None if targets is None else targets[p]
            for record in records:
                if end is None or record.offset < end:
                    self._write(p, record)
                    written += 1
        if targets is None:
            self._tails_due()
        return written

    async def _short(self, partition: int, targets: Mapping[int, int]) -> bool:
        return await self.log.position(partition) < targets[partition]

    async def run_to(self, targets: Mapping[int, int]) -> None:
        """Archive every partition up to ``targets`` (exclusive), then write the tails."""
        while any([await self._short(p, targets) for p in self.partitions]):
            await self.step(targets=targets)
        self.write_tails()

    async def run(
        self, stop: asyncio.Event, *, between: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Archive as records come until ``stop`` is set, then write the tails.

        ``between`` is awaited after every read (the command reads the log end for its lag).
        """
        while not stop.is_set():
            await self.step()
            if between is not None:
                await between()
        self.write_tails()

    def _write(self, partition: int, record: Record) -> None:
        part = self._parts[partition]
        if part.writer is None:
            part.writer = FileWriter(self.root, self.namespace, partition, record.offset)
            part.opened_at = self.clock.monotonic_s()
        writer = part.writer
        writer.write(LoggedEvent.from_record(record))
        if writer.count >= self.roll.records or writer.payload_bytes >= self.roll.payload_bytes:
            part.writer, part.tail_last = None, -1
            self._finished(writer.finish(tail=False), writer.count)

    def _tails_due(self) -> None:
        now = self.clock.monotonic_s()
        for p, part in self._parts.items():
            if part.writer is not None and now - part.opened_at >= self.roll.tail_s:
                self._write_tail(p, part, reread=True)

    def write_tails(self) -> None:
        """Write each partition's open file as a tail (when it holds more than the last tail)."""
        for p, part in self._parts.items():
            self._write_tail(p, part, reread=False)

    def _write_tail(self, partition: int, part: _Partition, *, reread: bool) -> None:
        writer = part.writer
        if writer is None:
            return
        if writer.last <= part.tail_last:  # the tail on disk already holds these records
            if reread:
                part.opened_at = self.clock.monotonic_s()  # an idle partition costs nothing
                return
            writer.abandon()
        else:
            part.tail_last = writer.last
            self._finished(writer.finish(tail=True), writer.count)
        part.writer = None
        if reread:
            # The open file starts again from its first record, so it rolls where it would have.
            self.log.seek(partition, writer.first)

    def _finished(self, file: ArchiveFile, records: int) -> None:
        self.state.archived_last[file.partition] = file.last
        self.state.files.append(file)
        log.info(
            "archive_file_written",
            partition=file.partition,
            first=file.first,
            last=file.last,
            records=records,
            tail=file.tail,
        )
        if self.on_file is not None:
            self.on_file(file, records)

    def abandon(self) -> None:
        """Drop the files being written (on a failure; the next run starts them again)."""
        for part in self._parts.values():
            if part.writer is not None:
                part.writer.abandon()
                part.writer = None
