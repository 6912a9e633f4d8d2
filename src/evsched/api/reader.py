"""What the API needs of a read replica: its indexes, read-your-writes and how far behind it is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from evsched.adapters.index.store import PartitionIndex
from evsched.core.state import JobState, ScheduleState, TimelineEntry
from evsched.runtime.projection.projector import CommitHook, Projector


class ReplicaView(Protocol):
    """``runtime.replica.Replica`` (tests use an in-memory twin folding a MemoryLog)."""

    on_commit: CommitHook | None

    @property
    def projectors(self) -> Mapping[int, Projector]: ...

    @property
    def running(self) -> bool: ...

    @property
    def failing(self) -> Mapping[int, str]:
        """Partitions whose last fold failed, with the reason (they are retried meanwhile)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def partition_of(self, key: str) -> int: ...

    def index(self, partition: int) -> PartitionIndex: ...

    async def wait_for(self, partition: int, offset: int, timeout_s: float = 10.0) -> None:
        """Return once ``offset`` of ``partition`` is folded; TimeoutError after ``timeout_s``."""
        ...

    async def lag(self) -> dict[int, int]:
        """Records per partition not yet read; raises when the broker cannot be asked."""
        ...


def job(replica: ReplicaView, job_id: str) -> JobState | None:
    return replica.index(replica.partition_of(job_id)).job(job_id)


def schedule(replica: ReplicaView, schedule_id: str) -> ScheduleState | None:
    """A live schedule; a deleted one reads as absent."""
    state = replica.index(replica.partition_of(schedule_id)).schedule(schedule_id)
    return None if state is None or state.deleted else state


def timeline(
    replica: ReplicaView, entity_id: str, *, schedule: bool = False
) -> list[TimelineEntry]:
    return replica.index(replica.partition_of(entity_id)).timeline(entity_id, schedule=schedule)


# A timeline page's default and largest size: a reused id keeps a retention period of runs
# (``index_runs``), thousands of events for one firing every minute.
TIMELINE_PAGE, MAX_TIMELINE_PAGE = 1_000, 10_000
# The largest offset a page may start after: Kafka's offsets are signed 64-bit.
MAX_OFFSET = 2**63 - 1


def timeline_page(
    replica: ReplicaView, entity_id: str, *, schedule: bool, after: int, limit: int
) -> tuple[list[TimelineEntry], int | None]:
    """At most ``limit`` timeline entries of ``entity_id`` past offset ``after``, and the
    ``after`` of the next page (None when none is left)."""
    index = replica.index(replica.partition_of(entity_id))
    found = index.timeline_page(entity_id, schedule=schedule, after=after, limit=limit + 1)
    if len(found) <= limit:
        return found, None
    return found[:limit], found[limit - 1].offset


def partitions(replica: ReplicaView) -> list[int]:
    return sorted(replica.projectors)
