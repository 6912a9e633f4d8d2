"""Timeline entries that no purge of their own removes: they expire from the log on marks.

An event the fold rejects for a job the index does not hold (a late completion after the job's
purge, a forged event for an id never enqueued, a forged ``JobPurged``) is an *orphan*. Its
timeline entry is kept for audits, but not for ever (fold version 6). While the job's purge mark
is kept, the orphan follows that mark (``purge_followers``, keyed like its timeline entry) and
goes when the mark expires. Any other orphan gets a mark of its own in ``orphans`` at
``retention.orphan_until`` and goes at the first applied purge at or after that log time, as
purge marks do. ``index_purge.PurgeWriter`` decides both in log order with the batch's purges,
so the index after any offset is the same however the records were batched.

Two more kinds of entries get own marks the same way (fold version 7), as their entities are
never purged: a rejected event of a schedule the index does not hold (schedule timeline), and
every ``QueuePermit`` step of a limit, whatever its verdict (the permit timeline, keyed by the
limit's name). So an ``orphans`` value names the entry's timeline: its family byte (``j``, ``s``,
``p``: ``index_keys.timeline_family``), then the entity id; the key gives the offset.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from evsched.adapters import avro
from evsched.adapters.index.keys import (
    FOLLOWERS,
    JOB_TIMELINE,
    ORPHANS,
    TIMELINE,
    U64,
    prefix_end,
    timeline_key,
)
from evsched.core import retention
from evsched.core.state import Verdict


@dataclass(frozen=True, slots=True)
class Orphan:
    """A timeline entry at ``offset`` (log time ``log_at``) that expires on a mark: a rejected
    event of a job or schedule the index does not hold, or a limit's permit step.

    ``family`` is the first byte of its timeline key; only a job's orphan (``JOB_TIMELINE``) may
    follow a purge mark.
    """

    entity_id: str
    offset: int
    log_at: int
    family: bytes = JOB_TIMELINE


class OrphanTarget(Protocol):
    """What of the index the orphans' marks are written through."""

    def h(self, name: str) -> Any: ...

    def scan(
        self, name: str, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def ranges(self, name: str) -> Callable[[bytes, bytes], Iterator[bytes]]: ...

    def low(self, name: str) -> int: ...

    def lower(self, name: str, at: int) -> None: ...

    def raise_low(self, name: str, at: int) -> None: ...


def orphan_key(until: int, offset: int) -> bytes:
    """An ``orphans`` key: the mark's expiry (8 B BE), then the orphan's offset (8 B BE).

    Its value is the timeline's family byte, then the entity id (``orphan_value``).
    """
    return U64.pack(max(0, until)) + U64.pack(offset)


def orphan_value(orphan: Orphan) -> bytes:
    """An ``orphans`` value: the family byte of the entry's timeline, then the entity id."""
    return orphan.family + orphan.entity_id.encode()


def kept_purge(index: OrphanTarget, job_id: str) -> int | None:
    """The offset of the purge whose mark ``job_id`` still has in ``index``, or None.

    Only the first entry of the job's timeline is read: an applied purge deletes every entry
    below it, and its mark's expiry deletes the purge's own, so a kept purge is always first
    (a flood of forged events for one id costs one read each, not the whole timeline).
    """
    prefix = timeline_key(job_id, 0)[:-8]
    for _, value in index.scan(TIMELINE, prefix, prefix_end(prefix)):
        size = int(U64.unpack(value[:8])[0])
        entry = avro.decode_timeline(value[8 : 8 + size])
        applied = entry.kind == "JobPurged" and entry.verdict is Verdict.APPLIED
        return entry.offset if applied else None
    return None


class OrphanMarks:
    """The orphans' marks and expiries of one batch, driven by ``PurgeWriter`` in log order."""

    def __init__(self, index: OrphanTarget, wb: Any) -> None:
        self._index = index
        self._wb = wb
        # Own marks in the index below this time are deleted already (before or in this batch).
        self._scanned = index.low(ORPHANS)
        # Own marks made in this batch and not expired in it: keys (expiry first, so the heap
        # gives the earliest) and their values. Permit steps make one each, so a rebuild's batch
        # holds thousands: a purge must not pass over all of them.
        self._due: list[bytes] = []
        self._created: dict[bytes, bytes] = {}
        self._followers: dict[str, list[bytes]] = {}  # followers made in this batch, per job
        # One iterator for the batch's lookups (``PartitionIndex.ranges``: one per purge mark
        # expired would cost an iterator per purge in steady state).
        self._stored_followers: Callable[[bytes, bytes], Iterator[bytes]] | None = None

    def expire(self, log_at: int) -> None:
        """An applied purge at ``log_at``: every own mark at or below it goes, with its entry."""
        end = log_at + 1
        if end > self._scanned:
            for key, value in self._index.scan(ORPHANS, U64.pack(self._scanned), U64.pack(end)):
                self._drop(key, value)
            self._scanned = end
        while self._due and _time(self._due[0]) <= log_at:
            key = heapq.heappop(self._due)
            self._drop(key, self._created.pop(key))

    def mark_expired(self, job_id: str) -> None:
        """A purge mark of ``job_id`` expired: the orphans that followed it go with it."""
        prefix = timeline_key(job_id, 0)[:-8]
        if self._stored_followers is None:
            self._stored_followers = self._index.ranges(FOLLOWERS)
        stored = list(self._stored_followers(prefix, prefix_end(prefix)))
        followers, timeline = self._index.h(FOLLOWERS), self._index.h(TIMELINE)
        for key in stored + self._followers.pop(job_id, []):
            self._wb.delete(key, followers)
            self._wb.delete(key, timeline)

    def add(self, orphan: Orphan, *, follows: bool) -> None:
        """Keep ``orphan`` until its job's kept purge mark expires (``follows``), or its own."""
        if follows:
            key = timeline_key(orphan.entity_id, orphan.offset)
            self._wb.put(key, b"", self._index.h(FOLLOWERS))
            self._followers.setdefault(orphan.entity_id, []).append(key)
            return
        key = orphan_key(retention.orphan_until(orphan.log_at), orphan.offset)
        value = orphan_value(orphan)
        self._wb.put(key, value, self._index.h(ORPHANS))
        heapq.heappush(self._due, key)
        self._created[key] = value

    def finish(self) -> None:
        """Move the scan bound of the own marks past what this batch deleted."""
        self._stored_followers = None  # its iterator must not outlive the batch (nor the DB)
        self._index.raise_low(ORPHANS, self._scanned)
        if self._due:  # the earliest of the batch's own marks still kept
            self._index.lower(ORPHANS, _time(self._due[0]))

    def _drop(self, key: bytes, value: bytes) -> None:
        self._wb.delete(key, self._index.h(ORPHANS))
        offset = int(U64.unpack(key[8:16])[0])
        family, entity_id = value[:1], value[1:].decode()
        self._wb.delete(timeline_key(entity_id, offset, family=family), self._index.h(TIMELINE))


def _time(key: bytes) -> int:
    return int(U64.unpack(key[:8])[0])
