"""The ``due_priority`` family of the index: scheduled jobs by priority, then run_at, then id.

The ``due`` family orders scheduled jobs by run_at, and the scheduler reads a bounded window of
it per step. Under a backlog deeper than that window, a job enqueued now sits behind every older
one and is not even a candidate, whatever its priority. This family lets the scheduler read the
due jobs in the order it leases them: highest priority first, then earliest run_at.

Key: ``rank`` (8 B BE, ``MAX_PRIORITY - priority``, so a higher priority sorts first), run_at
(8 B BE), job id. A scan walks the priority levels it knows in rank order and, within each,
reads only keys with ``run_at <= now``, so delayed jobs of a high priority cost one read per
level. Deleted keys stay as tombstones until compaction, and leases delete a level's earliest
keys first: each level therefore keeps a low-water mark (a run_at no live key of the level is
below), and its scans start there, as the time-ordered families do.

Value: the job's queue, and its concurrency key after a NUL when it has one (empty in entries
written before they were kept), so a planner can tell which queue a due job is on, and which
global limits may hold for it, without decoding its state (``DueEntry``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import NamedTuple

from evsched.core.bounds import MAX_PRIORITY
from evsched.core.permits import concurrency_key
from evsched.core.state import JobState, Status

DUE_PRIORITY = "due_priority"
# In META: set once the family holds every scheduled job (an index from before it is filled
# from ``due`` when it is opened).
BUILT = b"due_priority_built"
_PAIR = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_MAX_RANK = 2 * MAX_PRIORITY

Scan = Callable[[bytes, bytes | None], Iterator[tuple[bytes, bytes]]]


class DueEntry(NamedTuple):
    """A scheduled job as its ``due_priority`` key and value tell it, without its state (a
    tuple: a scan makes one per key read).

    ``queue`` is empty when the entry cannot stand for the state: written before the family kept
    queues, or at a bound where the key clamps the priority or run_at (decode the job instead).
    ``key`` is the job's concurrency key (``core.permits``), empty when it has none.
    """

    job_id: str
    priority: int
    run_at: int
    queue: str
    key: str = ""

    @property
    def status(self) -> Status:
        return Status.SCHEDULED  # the family holds scheduled jobs only


def rank(priority: int) -> int:
    """A job's level in the family: 0 is the highest priority."""
    return min(_MAX_RANK, max(0, MAX_PRIORITY - priority))


def priority_key(priority: int, run_at: int, job_id: str) -> bytes:
    return _PAIR.pack(rank(priority), max(0, run_at)) + job_id.encode()


def priority_value(state: JobState) -> bytes:
    """The queue, then a NUL and the concurrency key if the job has one (no queue holds a NUL)."""
    key = concurrency_key(state)
    queue = state.queue.encode()
    return queue if key is None else queue + b"\x00" + key.encode()


class PriorityLevels:
    """The levels of one index's ``due_priority`` family and each one's low-water mark."""

    def __init__(self, scan: Scan) -> None:
        self._scan = scan
        self._low: dict[int, int] = {}  # rank -> a run_at no live key of the level is below
        self._discover()

    def _discover(self) -> None:
        """Find every level with a key: one seek per level, at open."""
        start = b""
        while (found := next(self._scan(start, None), None)) is not None:
            level, at = _PAIR.unpack(found[0][:16])
            self._low[level] = at
            if level >= _MAX_RANK:
                return
            start = _U64.pack(level + 1)

    def lower(self, priority: int, run_at: int) -> None:
        """A key of this level at ``run_at`` is being written."""
        level = rank(priority)
        at = max(0, run_at)
        if at < self._low.get(level, at + 1):
            self._low[level] = at

    def due(
        self, now: int, limit: int, *, skip: Callable[[str], bool] | None, max_reads: int
    ) -> list[str]:
        """Up to ``limit`` ids with run_at <= ``now``, highest priority first, then earliest.

        Jobs ``skip`` holds back do not count toward ``limit``; at most ``max_reads`` keys are
        read (levels with nothing due cost one read each).
        """
        by_entry = None if skip is None else _by_id(skip)
        return [e.job_id for e in self.entries(now, limit, skip=by_entry, max_reads=max_reads)]

    def entries(
        self, now: int, limit: int, *, skip: Callable[[DueEntry], bool] | None, max_reads: int
    ) -> list[DueEntry]:
        """``due`` as entries: the same keys read, the same ones returned, no state decoded."""
        now = max(0, now)
        found: list[DueEntry] = []
        reads = 0
        for level in sorted(self._low):
            low = self._low[level]
            if low > now:
                continue
            first: int | None = None
            scan = self._scan(_PAIR.pack(level, low), _U64.pack(level + 1))
            for key, value in scan:
                reads += 1
                at = int(_U64.unpack(key[8:16])[0])
                first = at if first is None else first
                if at > now:
                    break
                entry = _entry(level, at, key[16:].decode(), value)
                if skip is None or not skip(entry):
                    found.append(entry)
                if len(found) >= limit or reads >= max_reads:
                    break
            self._settle(level, first)
            if len(found) >= limit or reads >= max_reads:
                break
        return found

    def _settle(self, level: int, first: int | None) -> None:
        """Raise a level's mark to the first live key its scan met; forget an empty level."""
        if first is None:
            del self._low[level]  # a later write brings it back (``lower``)
        else:
            self._low[level] = first


def _by_id(skip: Callable[[str], bool]) -> Callable[[DueEntry], bool]:
    return lambda entry: skip(entry.job_id)


def _entry(level: int, at: int, job_id: str, value: bytes) -> DueEntry:
    priority = MAX_PRIORITY - level
    # At a bound the key may have clamped the state's priority or run_at: not exact there.
    if not (0 < level < _MAX_RANK and at > 0):
        return DueEntry(job_id, priority, at, "")
    queue, _, key = value.partition(b"\x00")
    return DueEntry(job_id, priority, at, queue.decode(), key.decode())
