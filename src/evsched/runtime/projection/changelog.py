"""The state changelog: each partition's index changes on the compacted ``<ns>.state`` topic.

A node sends the changes of every index write in the same transaction as its decisions, effects
and consumer offset, and ends each transaction's changes with a meta record (the applied offset
and fold version they bring the index to). A deleted key is a tombstone, so compaction keeps the
newest value of every live key and nothing else: restoring a partition reads its changelog
partition once (proportional to live jobs, not to history) and folds the events from the meta's
applied offset on. Wire format: ``docs/wire-format.md``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass

from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.index.writes import Change, PreparedWrite
from evsched.ports import Outgoing, PartitionLog, Record
from evsched.runtime.process.offload import Offload, in_turn

# The meta record's key: no family name starts with a NUL byte.
META_KEY = b"\x00meta"
_META = struct.Struct(">BqQB")
META_FORMAT = 1
COMPLETE, SEEDING = 0, 1
SEPARATOR = b"\x00"

# Records read per fetch while restoring, and how long one read waits.
FETCH_RECORDS = 20_000
# Changelog records written to an index in one go while restoring.
LOAD_CHUNK_RECORDS = 2_000
# Consumer options of a restore's readers: it reads whole partitions, so large fetches.
RESTORE_FETCH = {"max_partition_fetch_bytes": 16 << 20, "fetch_max_bytes": 64 << 20}
READ_WAIT_S = 0.5
# The first look back from the end for the newest meta record (a transaction's last record).
LOOK_BACK = 64


@dataclass(frozen=True, slots=True)
class Meta:
    """Where a changelog partition brings an index: ``applied_offset`` of the events partition
    under ``fold_version``; ``complete`` is False while a snapshot is being written."""

    applied_offset: int
    fold_version: int
    complete: bool = True

    def covers(self, fold_version: int, log_start: int) -> bool:
        """Whether restoring this snapshot and folding the log from its offset on is complete."""
        return (
            self.complete
            and self.fold_version == fold_version
            and (self.applied_offset + 1 >= log_start)
        )


def encode_meta(meta: Meta) -> bytes:
    state = COMPLETE if meta.complete else SEEDING
    return _META.pack(META_FORMAT, meta.applied_offset, meta.fold_version, state)


def decode_meta(value: bytes) -> Meta | None:
    """The meta record's value; None for a format this version does not know."""
    if len(value) != _META.size or value[0] != META_FORMAT:
        return None
    _, applied, version, state = _META.unpack(value)
    return Meta(applied, version, complete=state == COMPLETE)


def change_key(family: str, key: bytes) -> bytes:
    return family.encode() + SEPARATOR + key


def decode_change(record: Record) -> Change | None:
    """A changelog record as an index change; None for the meta record (or a keyless one)."""
    if record.key is None or record.key.startswith(SEPARATOR):
        return None
    family, _, key = record.key.partition(SEPARATOR)
    return family.decode(), key, record.value


class ChangelogWriter:
    """Turns one partition's index writes into records of ``<ns>.state``, for its outbox."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition

    def records(self, prepared: PreparedWrite) -> list[Outgoing]:
        """The write's changes, then its meta record: last, so a transaction ends with it."""
        out = [self._record(change_key(f, k), v) for f, k, v in prepared.changes]
        out.append(self.meta(Meta(prepared.applied_offset, prepared.fold_version)))
        return out

    def meta(self, meta: Meta) -> Outgoing:
        return self._record(META_KEY, encode_meta(meta))

    def snapshot(self, changes: Iterable[Change]) -> Iterator[Outgoing]:
        """Records that write ``changes`` as they are (a whole index, when seeding)."""
        for family, key, value in changes:
            yield self._record(change_key(family, key), value)

    def _record(self, key: bytes, value: bytes | None) -> Outgoing:
        return Outgoing(topic=self.topic, key=key, value=value, partition=self.partition)


async def latest_meta(log: PartitionLog, partition: int) -> Meta | None:
    """The newest meta record of the partition's changelog: read from the end, backwards.

    Every transaction ends with a meta record, so it is almost always the last record before
    the end; aborted transactions (never returned) may push it further back.
    """
    start = (await log.start_offsets([partition]))[partition]
    end = (await log.end_offsets([partition]))[partition]
    window = LOOK_BACK
    while True:
        first = max(start, end - window)
        found: Meta | None = None
        async for records in _read(log, partition, first, end):
            for record in records:
                if record.key == META_KEY and record.value is not None:
                    found = decode_meta(record.value) or found
        if found is not None or first == start:
            return found
        window *= 16


async def restore_into(
    log: PartitionLog, partition: int, index: PartitionIndex, offload: Offload = in_turn
) -> Meta | None:
    """Load the partition's whole changelog into ``index`` (fresh); the newest meta, if any.

    Derived column families and the applied offset are written only for a meta found: without
    one the index holds no usable snapshot and the caller discards it. The records are loaded
    in order, ``LOAD_CHUNK_RECORDS`` at a time, each chunk by ``offload`` (a node's index
    thread; by default on the loop, in turns), so a large snapshot never holds the event loop.
    """
    start = (await log.start_offsets([partition]))[partition]
    end = (await log.end_offsets([partition]))[partition]
    found: Meta | None = None
    async for records in _read(log, partition, start, end):
        for first in range(0, len(records), LOAD_CHUNK_RECORDS):
            chunk = records[first : first + LOAD_CHUNK_RECORDS]
            found = await offload(functools.partial(_load, index, chunk)) or found
    if found is not None:
        meta = found
        await offload(lambda: index.finish_load(meta.applied_offset, meta.fold_version))
    return found


def _load(index: PartitionIndex, records: list[Record]) -> Meta | None:
    """Write the changes of ``records`` into ``index``; the newest meta among them, if any."""
    changes: list[Change] = []
    found: Meta | None = None
    for record in records:
        change = decode_change(record)
        if change is not None:
            changes.append(change)
        elif record.key == META_KEY and record.value is not None:
            found = decode_meta(record.value) or found
    index.load(changes)
    return found


async def changelog_keys(log: PartitionLog, partition: int) -> set[tuple[str, bytes]]:
    """Every (family, key) the partition's changelog holds a value for (tombstoned ones not)."""
    start = (await log.start_offsets([partition]))[partition]
    end = (await log.end_offsets([partition]))[partition]
    keys: set[tuple[str, bytes]] = set()
    async for records in _read(log, partition, start, end):
        for record in records:
            if (change := decode_change(record)) is None:
                continue
            if change[2] is None:
                keys.discard(change[:2])
            else:
                keys.add(change[:2])
    return keys


async def _read(
    log: PartitionLog, partition: int, first: int, end: int
) -> AsyncIterator[list[Record]]:
    """Batches of the partition's records from ``first`` up to ``end`` (exclusive)."""
    log.seek(partition, first)
    while await log.position(partition) < end:
        batches = await log.read([partition], READ_WAIT_S, FETCH_RECORDS)
        records = [r for r in batches.get(partition, []) if r.offset < end]
        if records:
            yield records
