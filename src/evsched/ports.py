"""The seams between evsched's engine and the outside: protocols, and the values that cross them.

Each port has a Kafka (or system) implementation in ``evsched.adapters`` and an in-memory twin in
``evsched.testing``; ``tests/contract`` runs one suite per port against both, so the twins behave
as the engine relies on Kafka to behave. Nothing here imports a third-party client.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from evsched.core.state import JobState
from evsched.errors import PublishError


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed record as the runtime sees it; ``log_at`` is the broker timestamp in epoch ms."""

    topic: str
    partition: int
    offset: int
    log_at: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Appended:
    """Where an acknowledged record landed."""

    topic: str
    partition: int
    offset: int
    # The broker's LogAppendTime in epoch ms, when the topic stamps records so (evsched's events
    # topic does); None otherwise.
    log_at: int | None = None


@dataclass(frozen=True, slots=True)
class Outbound:
    """A record for ``EventLog.append_many``/``append_atomic``; ``partition`` pins it (else the
    key's murmur2 partition)."""

    key: str
    value: bytes
    partition: int | None = None


class Clock(Protocol):
    """Wall time and a monotonic clock: ``adapters.clock.SYSTEM_CLOCK``, ``testing.FrozenClock``."""

    def now_ms(self) -> int:
        """Wall-clock time in epoch milliseconds (UTC)."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never jumps."""
        ...


class EventLog(Protocol):
    """Appends records and returns only once the broker acknowledged them (acks=all).

    Raises PublishError when it could not; ``testing.MemoryLog`` is the in-memory twin.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def append(
        self, topic: str, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Appended: ...

    async def append_many(
        self, topic: str, records: Sequence[Outbound]
    ) -> list[Appended | PublishError]:
        """Send every record at once (one round trip); each one's ack, or why it failed."""
        ...

    async def append_atomic(self, topic: str, records: Sequence[Outbound]) -> list[Appended]:
        """All records in one Kafka transaction, or none of them: PublishError then.

        A read_committed reader sees each partition's part whole, once that partition's commit
        marker is written; the parts of different partitions may appear moments apart."""
        ...

    async def partition_count(self, topic: str) -> int: ...


class DispatchFeed(Protocol):
    """Dispatch records for a worker pool; ``testing.MemoryFeed`` is the in-memory twin."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def take(self, max_records: int, timeout_s: float) -> list[Record]:
        """Up to ``max_records`` records, committed as they are taken (dispatch is a hint).

        Records whose commit the group refused because it rebalanced are not returned: the
        partitions' owner after the rebalance reads them again.

        With ``max_records`` 0 it takes nothing but keeps the pool membership alive.
        """
        ...


class WorkerPools(Protocol):
    """Which queues each worker pool of the namespace serves now: ``adapters.kafka.worker_groups``
    (the pools' consumer groups), ``testing.MemoryPools``."""

    async def pools(self) -> Mapping[str, Mapping[str, int] | None]:
        """Pool (group id) -> its live members per queue they hold dispatch partitions of; None
        for a pool that is rebalancing (not told then). Pools without members are left out.
        BrokerUnavailable when the pools cannot be told (unreachable, not authorized)."""
        ...

    async def close(self) -> None: ...


class JobReader(Protocol):
    """Reads a job's projected state (a read replica, or the API); None when it is unknown."""

    async def job(self, job_id: str) -> JobState | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Outgoing:
    """A record a partition's owner sends: an effect, a decision's event or its dispatch record."""

    topic: str
    key: bytes
    value: bytes | None  # None: a tombstone (the state changelog's deleted keys)
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    queue: str | None = None  # set on dispatch records: their topic must exist first
    # The job or schedule a decision is about; a refused record quarantines every record of its
    # decision. None on effects, which are never held back.
    decision: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerOffset:
    """The consumer group's position sent with a transaction: read ``topic``/``partition`` from
    ``next_offset`` on."""

    topic: str
    partition: int
    next_offset: int
    group_id: str


class Holdback(Protocol):
    """Where an outbox holds back decisions whose records cannot go:
    ``runtime.partition.quarantine``."""

    def holds(self, entity: str) -> bool: ...

    def add(
        self,
        entity: str,
        stage: str,
        reason: str,
        *,
        hold_s: float | None = None,
        quiet: bool = False,
    ) -> None: ...


class PartitionOutbox(Protocol):
    """Sends one events partition's outputs and consumer offset atomically (a transaction).

    ``KafkaOutbox`` in ``evsched.adapters.kafka.partition_outbox``; ``testing.MemoryOutbox``
    is the twin.
    """

    async def start(self) -> None:
        """Take the partition's transactional id: an older owner's outbox is fenced from now on."""
        ...

    async def send(
        self, outgoing: Sequence[Outgoing], *, offset: ConsumerOffset | None, holdback: Holdback
    ) -> list[Outgoing]:
        """Send ``outgoing`` and ``offset`` (if any) in one transaction; returns what was sent.

        A decision whose record is refused (too large, topic unusable) is added to ``holdback``
        and sent without: only that decision waits, the rest commits. Raises ``Fenced`` when a
        newer owner took the transactional id, ``RecordRefused`` when an effect (never held
        back) is refused, ``BrokerUnavailable`` on other broker failures: nothing of the step
        is visible then.
        """
        ...

    async def close(self) -> None: ...


class PartitionLog(Protocol):
    """Reads chosen partitions of one topic, read_committed, from offsets the caller seeks to.

    Offsets advance past transaction markers and aborted records, which are never returned; a
    partition is read up to a target by waiting until ``position`` reaches it, not until a record
    at the target arrives (the last offset is often a marker). ``adapters.kafka.partition_log``
    holds the Kafka implementation, ``testing.MemoryPartitionLog`` the in-memory twin. Broker
    failures
    raise ``errors.BrokerUnavailable``.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def seek(self, partition: int, offset: int) -> None:
        """Read ``partition`` from ``offset`` on (below the log's start: from its start)."""
        ...

    async def position(self, partition: int) -> int:
        """The offset the next read of ``partition`` starts at."""
        ...

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        """The first offset each partition still holds (above 0 once retention trimmed it)."""
        ...

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        """The offset after the last committed record (or marker) of each partition."""
        ...

    async def read(
        self, partitions: Collection[int], timeout_s: float, max_records: int
    ) -> dict[int, list[Record]]:
        """Records of ``partitions`` from their positions on; waits up to ``timeout_s`` for any."""
        ...


class JobFeed(Protocol):
    """Follows single jobs on their events partitions without a replica, read_committed.

    ``follow`` yields the records keyed by ``job_id`` at or after ``offset`` of ``partition``
    (below the log's start: from its start) in offset order as they are committed, for as long
    as the caller iterates; many follows share one reader. Broker failures are retried inside
    (a follow just waits). ``adapters.kafka.job_feed.KafkaJobFeed`` holds the Kafka
    implementation, ``testing.MemoryJobFeed`` the in-memory twin.
    """

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def partition_of(self, job_id: str) -> int:
        """The events partition ``job_id``'s records go to (Kafka's murmur2 partitioner)."""
        ...

    def follow(self, job_id: str, partition: int, offset: int) -> AsyncGenerator[Record, None]: ...
