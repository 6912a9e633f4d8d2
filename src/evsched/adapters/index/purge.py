"""Writes a batch's purges into the index: ordinary deletes, so a changelog sees every one.

A purge deletes its job's state, timeline, idempotency key and time-index entries, and keeps its
own timeline entry (what audits read: when, where, and where the history still is) until
``mark_until``. Those marks expire deterministically from the log: each applied purge, at log time
T, first deletes every mark whose time is at most T. So the index after any offset is the same
however the records were batched, and in steady state it holds no more than two retention periods
of finished runs (a reused id's earlier runs leave on their own, ``index_runs``). The batch's
orphans (``index_orphans``) are judged in the same pass, in log order with the purges: they
follow a job's kept purge mark, or get a mark of their own (as do a limit's permit steps and an
unknown schedule's rejected events).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evsched.adapters.index.keys import (
    JOB_TIMELINE,
    JOBS,
    KEYS,
    MARKS,
    TIMELINE,
    U64,
    keys_key,
    time_key,
    timeline_family,
    timeline_key,
)
from evsched.adapters.index.orphans import Orphan, OrphanMarks, kept_purge
from evsched.core.state import JobState, TimelineEntry


@dataclass(frozen=True, slots=True)
class Purge:
    """An applied JobPurged: the job goes; the purge's timeline entry stays until ``mark_until``.

    ``stored`` is what the index held for the job when the batch began (None: nothing).
    """

    job_id: str
    offset: int
    log_at: int
    stored: JobState | None
    mark_until: int
    generation: int = 0  # the purged run's: past 0, the id may have runs entries (index_runs)


class PurgeTarget(Protocol):
    """What of the index the purges write through."""

    def h(self, name: str) -> Any: ...

    def scan(
        self, name: str, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def ranges(self, name: str) -> Callable[[bytes, bytes], Iterator[bytes]]: ...

    def delete_secondary(self, wb: Any, state: JobState) -> None: ...

    def low(self, name: str) -> int: ...

    def lower(self, name: str, at: int) -> None: ...

    def raise_low(self, name: str, at: int) -> None: ...


class PurgeWriter:
    """The deletes and marks of one batch's purges, added to its WriteBatch in log order."""

    def __init__(
        self,
        index: PurgeTarget,
        wb: Any,
        purges: Sequence[Purge],
        timeline: Sequence[tuple[str, TimelineEntry, bytes]],
        orphans: Sequence[Orphan] = (),
    ) -> None:
        self._index = index
        self._wb = wb
        self._purges = purges
        self._orphans = orphans
        self._orphan_marks = OrphanMarks(index, wb)
        # Purge marks expired in this batch, and the jobs it purged so far (for the orphans).
        self._expired: set[tuple[str, int]] = set()
        self._purged: set[str] = set()
        self._live: dict[str, int] = {}  # per job, its marks made in this batch and still kept
        # Marks in the index below this time are deleted already (before or in this batch).
        self._scanned = index.low(MARKS)
        self._created: dict[bytes, tuple[str, int]] = {}
        # The batch's own marks by time, so expiring them is not a pass over all of them per
        # purge (a rebuild's batch holds thousands); the sequence keeps the order they came in.
        self._due: list[tuple[int, int, bytes]] = []
        self._seq = itertools.count()
        self._timeline_keys: Callable[[bytes, bytes], Iterator[bytes]] | None = None
        # This batch's own timeline entries per job: a purge deletes those below it too (none
        # to find in a batch of permit steps and orphans alone, as a limit's home has many).
        self._offsets: dict[str, list[int]] = {}
        for entity_id, entry, _ in timeline if purges else ():
            if timeline_family(entry.kind) == JOB_TIMELINE:
                self._offsets.setdefault(entity_id, []).append(entry.offset)

    def write(self) -> None:
        items: list[Purge | Orphan] = [*self._purges, *self._orphans]
        items.sort(key=_offset)  # log order: a purge and an orphan never share an offset
        for item in items:
            if isinstance(item, Orphan):
                self._orphan_marks.add(item, follows=self._follows(item))
                continue
            self._expire_marks(item.log_at)
            self._orphan_marks.expire(item.log_at)
            self._drop_job(item)
            self._mark(item)
            self._purged.add(item.job_id)
        self._timeline_keys = None  # its iterator must not outlive the batch (nor the DB)
        self._index.raise_low(MARKS, self._scanned)
        for key in self._created:
            self._index.lower(MARKS, _time(key))
        self._orphan_marks.finish()

    def _follows(self, orphan: Orphan) -> bool:
        """Whether ``orphan`` follows a kept purge mark (only jobs have them)."""
        return orphan.family == JOB_TIMELINE and self._mark_kept(orphan.entity_id)

    def _mark_kept(self, job_id: str) -> bool:
        """Whether a purge mark of ``job_id`` is kept at this point of the batch."""
        if self._live.get(job_id):
            return True
        if job_id in self._purged:
            return False  # purged in this batch, and that mark expired in it too
        stored = kept_purge(self._index, job_id)
        return stored is not None and (job_id, stored) not in self._expired

    def _expire_marks(self, log_at: int) -> None:
        end = log_at + 1
        if end > self._scanned:
            for key, value in self._index.scan(MARKS, U64.pack(self._scanned), U64.pack(end)):
                self._expire(key, key[8:].decode(), int(U64.unpack(value)[0]))
            self._scanned = end
        expired: list[tuple[int, bytes]] = []
        while self._due and self._due[0][0] <= log_at:
            _, seq, key = heapq.heappop(self._due)
            expired.append((seq, key))
        for _, key in sorted(expired):
            job_id, offset = self._created.pop(key)
            self._live[job_id] -= 1
            self._expire(key, job_id, offset)

    def _expire(self, key: bytes, job_id: str, offset: int) -> None:
        self._wb.delete(key, self._index.h(MARKS))
        self._wb.delete(timeline_key(job_id, offset), self._index.h(TIMELINE))
        self._expired.add((job_id, offset))
        self._orphan_marks.mark_expired(job_id)

    def _drop_job(self, purge: Purge) -> None:
        job_id, timeline = purge.job_id, self._index.h(TIMELINE)
        if self._timeline_keys is None:
            self._timeline_keys = self._index.ranges(TIMELINE)
        for key in self._timeline_keys(timeline_key(job_id, 0), timeline_key(job_id, purge.offset)):
            self._wb.delete(key, timeline)
        for offset in self._offsets.get(job_id, ()):
            if offset < purge.offset:
                self._wb.delete(timeline_key(job_id, offset), timeline)
        stored = purge.stored
        if stored is not None:
            self._wb.delete(job_id.encode(), self._index.h(JOBS))
            self._index.delete_secondary(self._wb, stored)
            if stored.idempotency_key is not None:
                self._wb.delete(keys_key(stored), self._index.h(KEYS))

    def _mark(self, purge: Purge) -> None:
        key = time_key(purge.mark_until, purge.job_id)
        self._wb.put(key, U64.pack(purge.offset), self._index.h(MARKS))
        if key not in self._created:
            heapq.heappush(self._due, (purge.mark_until, next(self._seq), key))
        self._created[key] = (purge.job_id, purge.offset)
        self._live[purge.job_id] = self._live.get(purge.job_id, 0) + 1


def _offset(item: Purge | Orphan) -> int:
    return item.offset


def _time(key: bytes) -> int:
    return int(U64.unpack(key[:8])[0])
