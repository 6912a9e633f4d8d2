"""Rejected events of jobs the index does not hold: their timeline entries expire from the log.

An event the fold rejects for a job the index does not hold (a late completion after the job's
purge, a forged event for an id never enqueued, a forged ``JobPurged``) is an *orphan*. Its
timeline entry is kept for audits, but not for ever (fold version 6). While the job's purge mark
is kept, the orphan follows that mark (``purge_followers``, keyed like its timeline entry) and
goes when the mark expires. Any other orphan gets a mark of its own in ``orphans`` at
``retention.orphan_until`` and goes at the first applied purge at or after that log time, as
purge marks do. ``index_purge.PurgeWriter`` decides both in log order with the batch's purges,
so the index after any offset is the same however the records were batched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from evsched.adapters import avro
from evsched.adapters.index_keys import (
    FOLLOWERS,
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
    """A rejected event at ``offset`` (log time ``log_at``) of a job the index does not hold."""

    job_id: str
    offset: int
    log_at: int


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
    """An ``orphans`` key: the mark's expiry (8 B BE), then the orphan's offset (8 B BE)."""
    return U64.pack(max(0, until)) + U64.pack(offset)


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
        self._created: dict[bytes, str] = {}  # own marks made in this batch -> job id
        self._followers: dict[str, list[bytes]] = {}  # followers made in this batch, per job
        # One iterator for the batch's lookups (``PartitionIndex.ranges``: one per purge mark
        # expired would cost an iterator per purge in steady state).
        self._stored_followers: Callable[[bytes, bytes], Iterator[bytes]] | None = None

    def expire(self, log_at: int) -> None:
        """An applied purge at ``log_at``: every own mark at or below it goes, with its entry."""
        end = log_at + 1
        if end > self._scanned:
            for key, value in self._index.scan(ORPHANS, U64.pack(self._scanned), U64.pack(end)):
                self._drop(key, value.decode())
            self._scanned = end
        for key, job_id in list(self._created.items()):
            if _time(key) <= log_at:
                del self._created[key]
                self._drop(key, job_id)

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
            key = timeline_key(orphan.job_id, orphan.offset)
            self._wb.put(key, b"", self._index.h(FOLLOWERS))
            self._followers.setdefault(orphan.job_id, []).append(key)
            return
        key = orphan_key(retention.orphan_until(orphan.log_at), orphan.offset)
        self._wb.put(key, orphan.job_id.encode(), self._index.h(ORPHANS))
        self._created[key] = orphan.job_id

    def finish(self) -> None:
        """Move the scan bound of the own marks past what this batch deleted."""
        self._stored_followers = None  # its iterator must not outlive the batch (nor the DB)
        self._index.raise_low(ORPHANS, self._scanned)
        for key in self._created:
            self._index.lower(ORPHANS, _time(key))

    def _drop(self, key: bytes, job_id: str) -> None:
        self._wb.delete(key, self._index.h(ORPHANS))
        offset = int(U64.unpack(key[8:16])[0])
        self._wb.delete(timeline_key(job_id, offset), self._index.h(TIMELINE))


def _time(key: bytes) -> int:
    return int(U64.unpack(key[:8])[0])
