"""The partition outbox's in-memory twin, over a broker twin that keeps partitions and offsets.

``MemoryBroker`` is what Kafka is to a node: partitions of records with offsets (a committed
transaction leaves a marker that takes one offset, as Kafka's does), a read_committed view, the
group's committed offsets, and one epoch per transactional id. ``MemoryOutbox`` sends through it
and can be told to refuse records, fail its next commit, or commit and then crash.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.errors import BrokerUnavailable, Fenced, RecordRefused
from evsched.ports import Clock, ConsumerOffset, Holdback, Outgoing, Record
from evsched.testing.partition_log import MemoryPartitionLog


class SimulatedCrash(Exception):
    """The process died right after its transaction committed (raised by a MemoryOutbox)."""


@dataclass(frozen=True, slots=True)
class Transaction:
    """One committed transaction: its records as they landed, and the consumer offset it carried."""

    transactional_id: str
    records: tuple[Record, ...]
    offset: ConsumerOffset | None


@dataclass
class MemoryBroker:
    """Partitions of records, group offsets and transactional-id epochs, as one Kafka cluster."""

    clock: Clock = SYSTEM_CLOCK  # stamps records with LogAppendTime
    # Largest record value per topic (Kafka's max.message.bytes); unlisted topics take any size.
    max_message_bytes: dict[str, int] = field(default_factory=dict)
    transactions: list[Transaction] = field(default_factory=list)
    _logs: dict[tuple[str, int], list[Record]] = field(default_factory=dict)
    _ends: dict[tuple[str, int], int] = field(default_factory=dict)
    _offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    _epochs: dict[str, int] = field(default_factory=dict)

    def append(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        partition: int = 0,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> Record:
        """A plain (non-transactional) write, as a client's enqueue."""
        return self._land(topic, partition, key, value, headers)

    def records(self, topic: str, partition: int = 0, start: int = 0) -> list[Record]:
        """What a read_committed consumer reads from ``start`` on."""
        return [r for r in self._logs.get((topic, partition), []) if r.offset >= start]

    def reader(self, topic: str, partitions: int = 1) -> MemoryPartitionLog:
        """A read_committed reader of ``topic`` as it stands now (markers take their offsets)."""
        log = MemoryPartitionLog(topic, partitions)
        for partition in range(partitions):
            entries: list[Record | None] = [None] * self.end_offset(topic, partition)
            for record in self.records(topic, partition):
                entries[record.offset] = record
            log.entries[partition] = entries
        return log

    def end_offset(self, topic: str, partition: int = 0) -> int:
        """The next offset to be written (past transaction markers)."""
        return self._ends.get((topic, partition), 0)

    def committed(self, group_id: str, topic: str, partition: int = 0) -> int | None:
        """The group's committed offset for the partition (the next one to read)."""
        return self._offsets.get((group_id, topic, partition))

    def claim(self, transactional_id: str) -> int:
        """A new epoch for ``transactional_id``: every older holder is fenced from now on."""
        epoch = self._epochs.get(transactional_id, 0) + 1
        self._epochs[transactional_id] = epoch
        return epoch

    def fenced(self, transactional_id: str, epoch: int) -> bool:
        return self._epochs.get(transactional_id) != epoch

    def refusal(self, o: Outgoing) -> str | None:
        limit = self.max_message_bytes.get(o.topic)
        if limit is not None and o.value is not None and len(o.value) > limit:
            return f"MessageSizeTooLargeError({len(o.value)} bytes > {limit})"
        return None

    def commit(
        self,
        transactional_id: str,
        epoch: int,
        outgoing: Sequence[Outgoing],
        offset: ConsumerOffset | None,
    ) -> Transaction:
        """Land ``outgoing`` and ``offset`` together, or raise Fenced and land nothing."""
        if self.fenced(transactional_id, epoch):
            raise Fenced(f"{transactional_id} epoch {epoch} was fenced by a newer owner")
        landed = tuple(
            self._land(o.topic, o.partition or 0, o.key, o.value, o.headers) for o in outgoing
        )
        for topic, partition in {(r.topic, r.partition) for r in landed}:
            self._ends[(topic, partition)] += 1  # the commit marker takes an offset
        if offset is not None:
            self._offsets[(offset.group_id, offset.topic, offset.partition)] = offset.next_offset
        done = Transaction(transactional_id, landed, offset)
        self.transactions.append(done)
        return done

    def _land(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: tuple[tuple[str, bytes], ...],
    ) -> Record:
        offset = self._ends.get((topic, partition), 0)
        record = Record(topic, partition, offset, self.clock.now_ms(), key, value, headers)
        self._logs.setdefault((topic, partition), []).append(record)
        self._ends[(topic, partition)] = offset + 1
        return record


class MemoryOutbox:
    """The PartitionOutbox twin: commits into a MemoryBroker under a transactional id.

    Records with no partition land on partition 0 (the twin has no partitioner).
    """

    def __init__(self, broker: MemoryBroker, transactional_id: str = "ns.node.p0") -> None:
        self.broker = broker
        self.transactional_id = transactional_id
        self.epoch: int | None = None
        self.closed = False
        self.sent: list[Transaction] = []  # this outbox's committed transactions
        self._refuse: list[Callable[[Outgoing], str | None]] = []
        self._commit_failures: list[Exception] = []
        self._crash_after_commit = False

    async def start(self) -> None:
        self.epoch = self.broker.claim(self.transactional_id)

    async def close(self) -> None:
        self.closed = True

    def refuse(self, reason_for: Callable[[Outgoing], str | None]) -> None:
        """Refuse every record for which ``reason_for`` gives a reason, like a broker would."""
        self._refuse.append(reason_for)

    def fail_next_commit(self, error: Exception | None = None) -> None:
        """The next send fails with ``error`` (BrokerUnavailable by default), nothing committed."""
        self._commit_failures.append(error or BrokerUnavailable("injected commit failure"))

    def crash_after_commit(self) -> None:
        """The next send commits, then raises SimulatedCrash before the caller hears of it."""
        self._crash_after_commit = True

    async def send(
        self, outgoing: Sequence[Outgoing], *, offset: ConsumerOffset | None, holdback: Holdback
    ) -> list[Outgoing]:
        if self.epoch is None or self.closed:
            raise BrokerUnavailable(f"outbox {self.transactional_id} is not started")
        if self.broker.fenced(self.transactional_id, self.epoch):
            raise Fenced(f"{self.transactional_id} epoch {self.epoch} was fenced by a newer owner")
        records = [o for o in outgoing if o.decision is None or not holdback.holds(o.decision)]
        refused: set[str] = set()
        for o in records:
            reason = None if o.decision in refused else self._reason(o)
            if reason is None:
                continue
            if o.decision is None:
                raise RecordRefused(reason)  # effects are never held back: the step fails
            holdback.add(o.decision, "send", reason)
            refused.add(o.decision)
        records = [o for o in records if o.decision not in refused]
        if self._commit_failures:
            raise self._commit_failures.pop(0)
        self.sent.append(self.broker.commit(self.transactional_id, self.epoch, records, offset))
        if self._crash_after_commit:
            self._crash_after_commit = False
            raise SimulatedCrash(f"crashed after committing to {self.transactional_id}")
        return records

    def _reason(self, o: Outgoing) -> str | None:
        for reason_for in (self.broker.refusal, *self._refuse):
            if (reason := reason_for(o)) is not None:
                return reason
        return None
