"""Earlier runs of a reused job id leave the index after their retention, while the id lives on.

A job id that begins a new run (``core.retention.ended_run``: a keyed job past its key window, a
``unique`` job, the one job id of a ``skip`` or ``buffer`` schedule) gets a ``runs`` entry at the
new run's first offset, holding when the runs before it leave (the ended run's end plus its
retention, never before an earlier run of the id: runs leave in order, so the runs kept are
always the latest ones, whole) and the job's state there; and a ``run_marks`` entry at that time.
After each event the index folds, every run mark at or below its log time is gone, with the
job's timeline entries below the mark's offset and its ``runs`` entries before that one. The
oldest ``runs`` entry left is the base a refold of the kept runs starts from
(``PartitionIndex.run_base``). So the index after any offset is the same however the records were
batched, and needs no event of its own: the log's times decide, as for purge marks. An applied
purge of the id deletes its ``runs`` entries; its marks, left to expire, then find nothing.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evsched.adapters import avro
from evsched.adapters.index.keys import (
    JOB_TIMELINE,
    RUN_MARKS,
    RUNS,
    TIMELINE,
    U64,
    prefix_end,
    runs_key,
    timeline_family,
    timeline_key,
)
from evsched.adapters.index.purge import Purge
from evsched.core.retention import EndedRun
from evsched.core.state import TimelineEntry


@dataclass(frozen=True, slots=True)
class RunStart:
    """The fold of the record at ``offset`` began a new run of ``job_id``, ending ``ended``."""

    job_id: str
    offset: int
    ended: EndedRun


class RunTarget(Protocol):
    """What of the index the runs are written through."""

    def h(self, name: str) -> Any: ...

    def scan(
        self, name: str, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]: ...

    def ranges(self, name: str) -> Callable[[bytes, bytes], Iterator[bytes]]: ...

    def last(self, name: str, prefix: bytes) -> tuple[bytes, bytes] | None: ...

    def low(self, name: str) -> int: ...

    def lower(self, name: str, at: int) -> None: ...

    def raise_low(self, name: str, at: int) -> None: ...


def mark_key(until: int, boundary: int) -> bytes:
    """A ``run_marks`` key: when the runs go (8 B BE), then the next run's first offset (8 B BE).

    Its value is the job id.
    """
    return U64.pack(max(0, until)) + U64.pack(boundary)


def runs_prefix(job_id: str) -> bytes:
    return runs_key(job_id, 0)[:-8]


class RunWriter:
    """The run entries and expiries of one batch, added to its WriteBatch in log order."""

    def __init__(
        self,
        index: RunTarget,
        wb: Any,
        starts: Sequence[RunStart],
        purges: Sequence[Purge],
        timeline: Sequence[tuple[str, TimelineEntry, bytes]],
    ) -> None:
        self._index = index
        self._wb = wb
        self._starts = {start.offset: start for start in starts}
        # Only a job past its first run can have ``runs`` entries for its purge to delete.
        self._purges = {p.offset: p for p in purges if p.generation > 0}
        self._timeline = timeline
        # This batch's own timeline entries of the jobs that began a run in it: an expiry in the
        # batch deletes those below its offset too (the DB does not hold them yet).
        started = {start.job_id for start in starts}
        self._offsets: dict[str, list[int]] = {}
        for entity_id, entry, _ in timeline if started else ():
            if entity_id in started and timeline_family(entry.kind) == JOB_TIMELINE:
                self._offsets.setdefault(entity_id, []).append(entry.offset)
        # Per job, the (offset, leaves at) of the ``runs`` entries this batch made and kept.
        self._made: dict[str, list[tuple[int, int]]] = {}
        self._purged: set[str] = set()
        self._due: list[tuple[int, int, str]] = []  # run marks: (leaves at, offset, job id)
        self._keys: dict[str, Callable[[bytes, bytes], Iterator[bytes]]] = {}

    def write(self) -> None:
        if not self._timeline:
            return
        high = max(entry.log_at for _, entry, _ in self._timeline)
        low = self._index.low(RUN_MARKS)
        if low > high and not self._starts and not self._purges:
            return  # no RocksDB call at all while no run is due
        if low <= high:
            for key, value in self._index.scan(RUN_MARKS, U64.pack(low), U64.pack(high + 1)):
                self._due.append((_time(key), _boundary(key), value.decode()))  # in key order
        if self._starts or self._purges:
            for _, entry, _ in self._timeline:
                self._at(entry.offset)
                self._expire(entry.log_at)
        else:
            self._expire(high)
        self._keys.clear()  # their iterators must not outlive the batch (nor the DB)
        self._index.raise_low(RUN_MARKS, high + 1)
        if self._due:  # the earliest of the batch's own marks still kept
            self._index.lower(RUN_MARKS, self._due[0][0])

    def _at(self, offset: int) -> None:
        """The run begun and the purge applied by the record at ``offset``, if any."""
        start = self._starts.get(offset)
        if start is not None:
            self._start(start)
        purge = self._purges.get(offset)
        if purge is not None:
            self._purge(purge)

    def _start(self, start: RunStart) -> None:
        job_id, ended = start.job_id, start.ended
        earlier = self._last_until(job_id)
        until = ended.kept_until if earlier is None else max(earlier, ended.kept_until)
        value = U64.pack(max(0, until)) + avro.encode_state(ended.base)
        self._wb.put(runs_key(job_id, ended.boundary), value, self._index.h(RUNS))
        self._wb.put(mark_key(until, ended.boundary), job_id.encode(), self._index.h(RUN_MARKS))
        self._made.setdefault(job_id, []).append((ended.boundary, until))
        heapq.heappush(self._due, (until, ended.boundary, job_id))

    def _last_until(self, job_id: str) -> int | None:
        """When the job's latest kept run entry leaves: the newest runs leave last."""
        made = self._made.get(job_id)
        if made:
            return made[-1][1]
        if job_id in self._purged:
            return None  # its stored entries went with the purge
        found = self._index.last(RUNS, runs_prefix(job_id))
        return None if found is None else int(U64.unpack(found[1][:8])[0])

    def _purge(self, purge: Purge) -> None:
        job_id, runs = purge.job_id, self._index.h(RUNS)
        prefix = runs_prefix(job_id)
        for key in self._range(RUNS, prefix, prefix_end(prefix)):
            self._wb.delete(key, runs)
        for boundary, _ in self._made.pop(job_id, []):
            self._wb.delete(runs_key(job_id, boundary), runs)
        self._purged.add(job_id)

    def _expire(self, log_at: int) -> None:
        while self._due and self._due[0][0] <= log_at:
            until, boundary, job_id = heapq.heappop(self._due)
            self._drop(until, boundary, job_id)

    def _drop(self, until: int, boundary: int, job_id: str) -> None:
        """The runs of ``job_id`` before ``boundary`` leave: timeline entries and run entries."""
        self._wb.delete(mark_key(until, boundary), self._index.h(RUN_MARKS))
        timeline, runs = self._index.h(TIMELINE), self._index.h(RUNS)
        for key in self._range(TIMELINE, timeline_key(job_id, 0), timeline_key(job_id, boundary)):
            self._wb.delete(key, timeline)
        for offset in self._offsets.get(job_id, ()):
            if offset < boundary:
                self._wb.delete(timeline_key(job_id, offset), timeline)
        for key in self._range(RUNS, runs_key(job_id, 0), runs_key(job_id, boundary)):
            self._wb.delete(key, runs)
        made = self._made.get(job_id)
        if made:
            for earlier, _ in made:
                if earlier < boundary:
                    self._wb.delete(runs_key(job_id, earlier), runs)
            self._made[job_id] = [(b, u) for b, u in made if b >= boundary]

    def _range(self, name: str, start: bytes, end: bytes) -> Iterator[bytes]:
        """The stored keys of ``name`` in ``[start, end)``, read whole (one iterator a family)."""
        keys = self._keys.get(name)
        if keys is None:
            keys = self._keys[name] = self._index.ranges(name)
        return iter(list(keys(start, end)))


def _time(key: bytes) -> int:
    return int(U64.unpack(key[:8])[0])


def _boundary(key: bytes) -> int:
    return int(U64.unpack(key[8:16])[0])
