"""The state changelog: each partition's index on the compacted ``<ns>.state`` topic, a record per
changed job (or other key) per flush interval.

Like Kafka Streams' record cache, a node does not send every index write: it notes which keys
its applied batches changed and, once per ``FLUSH_INTERVAL_MS`` (``EVSCHED_CHANGELOG_INTERVAL_MS``),
sends the newest value of each of them, read from its index, then a meta record (the applied
offset and fold version the index stood at), all in one transaction. A restorer therefore only
ever sees whole flushes: a complete snapshot as of the meta's applied offset. Compaction keeps
the newest value of every live key; a deleted key is a tombstone.

Only what cannot be derived is replicated (format 2). The due, lease, cron, purge and priority
entries and the idempotency keys follow from the job and schedule states alone, so a restore
rebuilds them (``PartitionIndex.finish_load``). A job's timeline (every event of it with the
fold's verdict, and the event's bytes) cannot be derived from its state, nor from the log once
the log is trimmed, which is when a restore is needed: it travels in the job's one record, with
its state (``encode_job``), so a job costs one record per interval however many events it had.
The record carries the whole timeline, since compaction keeps only the newest value of a key;
timelines are short (a few entries per attempt), and a job's heartbeats are not re-sent more
often than once per interval. Lifetime tallies, schedules, pauses, limits, marks and the other
families cannot be derived from states either: each of their keys is a record of its own, sent
as above (a tally once per interval, not once per step).

The index may now run ahead of its changelog, by at most an interval of applied batches (the
index is written as each step's transaction commits, the changelog at each flush). That is safe
because a restore is the snapshot and then a fold of the events log from the meta's applied
offset on: the events log holds every record folded since, and a new owner folds the records
below the group's committed offset without sending anything (their outputs are in the log),
noting what they change for its own next flush. What must not happen is a changelog whose
newest meta lags an index that then keeps writing to it: the keys changed in between would be
missing. So a node flushes when its partition is revoked, an owner whose local index is ahead
of the changelog after a crash restores from the changelog (as Kafka Streams wipes an unclean
store under exactly-once), and a standby copy folds no further than the changelog's meta.

A changelog of format 1 (every index write as a record of its own) still restores: its records
are loaded as they are. A node seeds such a changelog in format 2 (tombstones of its old keys
first) before it writes to it. Wire format: ``docs/wire-format.md``.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass

from evsched.adapters.index.keys import (
    JOBS,
    TIMELINE,
    job_timeline_prefix,
    prefix_end,
    timeline_job,
)
from evsched.adapters.index.store import DERIVED_FAMILIES, STAGED_JOBS, PartitionIndex
from evsched.adapters.index.writes import Change, PreparedWrite
from evsched.ports import Outgoing, PartitionLog, Record
from evsched.runtime.process.offload import Offload, in_turn

# The meta record's key: no family name starts with a NUL byte.
META_KEY = b"\x00meta"
_META = struct.Struct(">BqQB")
# Format 2: job records (state and timeline in one value), derived families left out.
META_FORMAT = 2
KNOWN_FORMATS = frozenset((1, META_FORMAT))
COMPLETE, SEEDING = 0, 1
SEPARATOR = b"\x00"
# The family name of a job's record in format 2: its key is ``job``, a NUL, the job id.
JOB_RECORD = "job"
# A job record's value: its format, then the state's length (0: no state) and the state, then
# each timeline entry as its key past the job's prefix (the offset, 8 B BE), its length and value.
_JOB_HEAD = struct.Struct(">BI")
_ENTRY_HEAD = struct.Struct(">8sI")
JOB_FORMAT = 2
# A job's record holds its timeline entries up to this many bytes in all; the others (a huge
# event, or a job with thousands of them, a forger's included) go as records of their own
# (``timeline``, a NUL, the index key), which the job's record lists by offset (length
# ``OWN_RECORD``): a record stays well below the topic's 4 MB (topics.STATE_MAX_MESSAGE_BYTES).
INLINE_ENTRIES_BYTES = 512 << 10
OWN_RECORD = 0xFFFFFFFF

# Kafka Streams writes a store's cache out at each commit (100 ms under exactly-once). A job's
# life here is a few steps (enqueued, leased, started, ended) spread over tens of milliseconds
# to seconds: at one second most jobs cost one record, at 100 ms two to four. The price of a
# longer interval is a longer fold after a restore (at most an interval of events, milliseconds
# of work) and a standby copy that far behind; not lost work, since the log holds it all.
FLUSH_INTERVAL_MS = 1_000

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
    under ``fold_version``; ``complete`` is False while a snapshot is being written; ``format``
    is the changelog's (an older one restores, but is seeded anew before a node writes to it)."""

    applied_offset: int
    fold_version: int
    complete: bool = True
    format: int = META_FORMAT

    def covers(self, fold_version: int, log_start: int) -> bool:
        """Whether restoring this snapshot and folding the log from its offset on is complete."""
        return (
            self.complete
            and self.fold_version == fold_version
            and (self.applied_offset + 1 >= log_start)
        )


def encode_meta(meta: Meta) -> bytes:
    state = COMPLETE if meta.complete else SEEDING
    return _META.pack(meta.format, meta.applied_offset, meta.fold_version, state)


def decode_meta(value: bytes) -> Meta | None:
    """The meta record's value; None for a format this version does not know."""
    if len(value) != _META.size or value[0] not in KNOWN_FORMATS:
        return None
    form, applied, version, state = _META.unpack(value)
    return Meta(applied, version, complete=state == COMPLETE, format=form)


def change_key(family: str, key: bytes) -> bytes:
    return family.encode() + SEPARATOR + key


def decode_change(record: Record) -> Change | None:
    """A changelog record as (family, key, value); None for the meta record (or a keyless one).

    The family is ``JOB_RECORD`` for a job's record (``job_changes`` unpacks it)."""
    if record.key is None or record.key.startswith(SEPARATOR):
        return None
    family, _, key = record.key.partition(SEPARATOR)
    return family.decode(), key, record.value


def job_records(
    job_id: bytes, state: bytes | None, entries: Iterable[tuple[bytes, bytes]]
) -> list[tuple[bytes, bytes | None]]:
    """A job's records as (key, value): its own record, after the entries that do not fit in it
    (past ``INLINE_ENTRIES_BYTES``), each a ``timeline`` record of its own that it lists."""
    listed: list[tuple[bytes, bytes | None]] = []
    out: list[tuple[bytes, bytes | None]] = []
    inline = 0
    prefix = job_timeline_prefix(job_id)
    for suffix, value in entries:
        if inline + len(value) <= INLINE_ENTRIES_BYTES:
            inline += len(value)
            listed.append((suffix, value))
        else:
            out.append((change_key(TIMELINE, prefix + suffix), value))
            listed.append((suffix, None))
    out.append((change_key(JOB_RECORD, job_id), encode_job(state, listed)))
    return out


def encode_job(state: bytes | None, entries: Iterable[tuple[bytes, bytes | None]]) -> bytes | None:
    """A job's record: its state and timeline entries (None: an entry sent as its own record,
    listed by offset only); None (a tombstone) when it has neither state nor entries."""
    parts = [_JOB_HEAD.pack(JOB_FORMAT, 0 if state is None else len(state)), state or b""]
    for suffix, value in entries:
        parts.append(_ENTRY_HEAD.pack(suffix, OWN_RECORD if value is None else len(value)))
        parts.append(value or b"")
    if state is None and len(parts) == 2:
        return None
    return b"".join(parts)


def job_changes(job_id: bytes, value: bytes) -> tuple[list[Change], set[bytes]]:
    """The ``jobs`` and ``timeline`` puts a job's record stands for, and the ``timeline`` keys
    of every entry it lists (those sent as records of their own too); ValueError if malformed."""
    form, size = _JOB_HEAD.unpack_from(value)
    if form != JOB_FORMAT:
        raise ValueError(f"job record of format {form}, not {JOB_FORMAT}")
    at = _JOB_HEAD.size
    changes: list[Change] = []
    if size:
        changes.append((JOBS, job_id, value[at : at + size]))
        at += size
    prefix = job_timeline_prefix(job_id)
    listed: set[bytes] = set()
    while at < len(value):
        suffix, length = _ENTRY_HEAD.unpack_from(value, at)
        at += _ENTRY_HEAD.size
        listed.add(prefix + suffix)
        if length != OWN_RECORD:
            changes.append((TIMELINE, prefix + suffix, value[at : at + length]))
            at += length
    if at != len(value):
        raise ValueError("job record ends inside an entry")
    return changes, listed


class ChangelogWriter:
    """One partition's changelog: notes the keys its applied batches change, and flushes their
    newest values from the index once per interval, as records of ``<ns>.state``."""

    def __init__(self, topic: str, partition: int, *, interval_ms: int | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.interval_ms = FLUSH_INTERVAL_MS if interval_ms is None else interval_ms
        self._jobs: set[bytes] = set()  # ids of jobs whose state or timeline changed
        self._keys: set[tuple[str, bytes]] = set()  # every other changed key
        self.dirty_since: int | None = None  # when the oldest unflushed change was noted (ms)

    def note(self, prepared: PreparedWrite, now: int) -> None:
        """The keys of a batch just applied to the index: sent at the next flush."""
        for family, key, _ in prepared.changes:
            if family == JOBS:
                self._jobs.add(key)
            elif family == TIMELINE and (job_id := timeline_job(key)) is not None:
                self._jobs.add(job_id)
            else:
                self._keys.add((family, key))
        if self.dirty_since is None and (self._jobs or self._keys):
            self.dirty_since = now

    def deadline(self) -> int | None:
        """When the next flush is due (ms), None while nothing changed."""
        return None if self.dirty_since is None else self.dirty_since + self.interval_ms

    def due(self, now: int) -> bool:
        deadline = self.deadline()
        return deadline is not None and now >= deadline

    def flush(self, index: PartitionIndex) -> list[Outgoing]:
        """The newest value of every key changed since the last flush, then the meta record of
        the index's applied offset: a whole snapshot's worth of changes, for one transaction.

        Nothing is forgotten until ``flushed`` (the transaction committed): a flush whose
        transaction failed is sent again, newer, by the next one.
        """
        if self.dirty_since is None:
            return []
        out = [
            self._record(key, value)
            for job_id, state, entries in index.job_records(sorted(self._jobs))
            for key, value in job_records(job_id, state, entries)
        ]
        out += [
            self._record(change_key(family, key), index.get(family, key))
            for family, key in sorted(self._keys)
        ]
        fold_version = index.fold_version()
        assert fold_version is not None  # a batch was applied
        out.append(self.meta(Meta(index.applied_offset(), fold_version)))
        return out

    def flushed(self) -> None:
        """The last flush's transaction committed."""
        self._jobs.clear()
        self._keys.clear()
        self.dirty_since = None

    def tombstone(self, key: bytes) -> Outgoing:
        """The deletion of a record's key, whatever the format that wrote it."""
        return self._record(key, None)

    def meta(self, meta: Meta) -> Outgoing:
        return self._record(META_KEY, encode_meta(meta))

    def snapshot(self, index: PartitionIndex) -> Iterator[Outgoing]:
        """The records of the whole index (when seeding): its jobs' records, then every other
        mirrored key."""
        ids: set[bytes] = set()
        for family, key, _ in index.mirrored():
            if family == JOBS:
                ids.add(key)
            elif family == TIMELINE and (job_id := timeline_job(key)) is not None:
                ids.add(job_id)
        for job_id, state, entries in index.job_records(sorted(ids)):
            for key, value in job_records(job_id, state, entries):
                yield self._record(key, value)
        for family, key, value in index.mirrored():
            if family != JOBS and not (family == TIMELINE and timeline_job(key) is not None):
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

    Jobs' records are staged (the newest per job) and unpacked at the end; derived column
    families and the applied offset are written only for a meta found: without one the index
    holds no usable snapshot and the caller discards it. The records are loaded in order,
    ``LOAD_CHUNK_RECORDS`` at a time, each chunk by ``offload`` (a node's index thread; by
    default on the loop, in turns), so a large snapshot never holds the event loop.
    """
    start = (await log.start_offsets([partition]))[partition]
    end = (await log.end_offsets([partition]))[partition]
    found: Meta | None = None
    loose: set[bytes] = set()  # jobs with timeline entries sent as records of their own
    async for records in _read(log, partition, start, end):
        for first in range(0, len(records), LOAD_CHUNK_RECORDS):
            chunk = records[first : first + LOAD_CHUNK_RECORDS]
            found = await offload(functools.partial(_load, index, chunk, loose)) or found
    if found is not None:
        meta = found
        if meta.format != META_FORMAT:
            loose.clear()  # format 1: every entry is a record of its own, and no job's lists it
        after: bytes | None = b""
        while after is not None:
            after = await offload(functools.partial(_unstage, index, after, loose))
        await offload(functools.partial(_drop_unlisted, index, loose))
        await offload(lambda: index.finish_load(meta.applied_offset, meta.fold_version))
    return found


def _load(index: PartitionIndex, records: list[Record], loose: set[bytes]) -> Meta | None:
    """Write the changes of ``records`` into ``index``; the newest meta among them, if any.

    Jobs whose timeline entries came as records of their own are added to ``loose``."""
    changes: list[Change] = []
    found: Meta | None = None
    for record in records:
        change = decode_change(record)
        if change is None:
            if record.key == META_KEY and record.value is not None:
                found = decode_meta(record.value) or found
        elif change[0] == JOB_RECORD:
            changes.append((STAGED_JOBS, change[1], change[2]))
        elif change[0] not in DERIVED_FAMILIES:  # format 1 mirrored ``keys``: derived now
            changes.append(change)
            if change[0] == TIMELINE and (job_id := timeline_job(change[1])) is not None:
                loose.add(job_id)
    index.load(changes)
    return found


def _unstage(index: PartitionIndex, start: bytes, loose: set[bytes]) -> bytes | None:
    """Unpack up to ``LOAD_CHUNK_RECORDS`` staged job records from key ``start`` on; the key to
    go on from, None once all are.

    A ``loose`` job's entries that its newest record does not list are older records of their
    own, which the job has deleted since (a purge): they go."""
    changes: list[Change] = []
    last: bytes | None = None
    for count, (job_id, value) in enumerate(index.scan(STAGED_JOBS, start), start=1):
        puts, listed = job_changes(job_id, value)
        changes += puts
        if job_id in loose:
            loose.discard(job_id)
            changes += [(TIMELINE, key, None) for key in _timeline_keys(index, job_id) - listed]
        changes.append((STAGED_JOBS, job_id, None))
        last = job_id
        if count >= LOAD_CHUNK_RECORDS:
            break
    index.load(changes)
    return None if last is None else last + SEPARATOR


def _drop_unlisted(index: PartitionIndex, loose: set[bytes]) -> None:
    """Delete the entries of ``loose`` jobs that no job record lists (the job is gone)."""
    for job_id in sorted(loose):
        index.load([(TIMELINE, key, None) for key in sorted(_timeline_keys(index, job_id))])


def _timeline_keys(index: PartitionIndex, job_id: bytes) -> set[bytes]:
    prefix = job_timeline_prefix(job_id)
    return {key for key, _ in index.scan(TIMELINE, prefix, prefix_end(prefix))}


async def changelog_keys(log: PartitionLog, partition: int) -> set[bytes]:
    """The key of every record the partition's changelog holds a value for (not the meta's,
    nor a tombstoned one's), whatever its format."""
    start = (await log.start_offsets([partition]))[partition]
    end = (await log.end_offsets([partition]))[partition]
    keys: set[bytes] = set()
    async for records in _read(log, partition, start, end):
        for record in records:
            if record.key is None or record.key == META_KEY:
                continue
            if record.value is None:
                keys.discard(record.key)
            else:
                keys.add(record.key)
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
