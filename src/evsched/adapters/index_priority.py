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
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

from evsched.core.limits import MAX_PRIORITY

DUE_PRIORITY = "due_priority"
# In META: set once the family holds every scheduled job (an index from before it is filled
# from ``due`` when it is opened).
BUILT = b"due_priority_built"
_PAIR = struct.Struct(">QQ")
_U64 = struct.Struct(">Q")
_MAX_RANK = 2 * MAX_PRIORITY

Scan = Callable[[bytes, bytes | None], Iterator[tuple[bytes, bytes]]]


def rank(priority: int) -> int:
    """A job's level in the family: 0 is the highest priority."""
    return min(_MAX_RANK, max(0, MAX_PRIORITY - priority))


def priority_key(priority: int, run_at: int, job_id: str) -> bytes:
    return _PAIR.pack(rank(priority), max(0, run_at)) + job_id.encode()


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
        now = max(0, now)
        found: list[str] = []
        reads = 0
        for level in sorted(self._low):
            low = self._low[level]
            if low > now:
                continue
            first: int | None = None
            scan = self._scan(_PAIR.pack(level, low), _U64.pack(level + 1))
            for key, _ in scan:
                reads += 1
                at = int(_U64.unpack(key[8:16])[0])
                first = at if first is None else first
                if at > now:
                    break
                entity = key[16:].decode()
                if skip is None or not skip(entity):
                    found.append(entity)
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
