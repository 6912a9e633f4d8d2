"""Sends one partition step's records in a Kafka transaction, holding back decisions that can't go.

A decision (a lease with its dispatch record, an expiry, a cron fire) that cannot be encoded or
sent is one job's problem, never the partition's: it is quarantined with a logged reason and a
metric, the transaction is retried without it, and it is planned again after ``QUARANTINE_S``.
Effects are never held back: a step whose effects cannot be sent fails and is retried whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidTopicError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from aiokafka.structs import TopicPartition

from evsched.adapters.clock import monotonic_s

if TYPE_CHECKING:
    from evsched.metrics import PartitionInstruments

log = structlog.get_logger("evsched.node")

# How long a decision that could not be encoded or sent is held back before it is planned again:
# the cause may be gone by then (a topic repaired), and each failure costs one log line.
QUARANTINE_S = 30.0

# Errors about one record rather than the producer or the broker: its decision is quarantined.
RECORD_REFUSED: tuple[type[BaseException], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    KafkaTimeoutError,  # send() gave up waiting for the topic's metadata
)

# Transactions tried per step while records are refused; each failed try quarantines at least one
# decision, so a step never loops.
TRANSACTION_TRIES = 3

# Ensures the dispatch topics of ``queues`` exist; returns the queues refused, with the reason.
EnsureQueues = Callable[[set[str]], Awaitable[Mapping[str, str]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Outgoing:
    topic: str
    key: bytes
    value: bytes
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    queue: str | None = None  # set on dispatch records: their topic must exist first
    # The job or schedule a decision is about; a refused record quarantines every record of its
    # decision. None on effects, which are never held back.
    decision: str | None = None


class Quarantine:
    """Decisions held back, by entity id, until a monotonic time."""

    def __init__(
        self,
        partition: int,
        instruments: PartitionInstruments | None = None,
        hold_s: float = QUARANTINE_S,
    ) -> None:
        self.partition = partition
        self.instruments = instruments
        self.hold_s = hold_s
        self._until: dict[str, float] = {}
        self.fresh: set[str] = set()  # added since the caller last took them

    def holds(self, entity: str) -> bool:
        until = self._until.get(entity)
        if until is None:
            return False
        if until > monotonic_s():
            return True
        del self._until[entity]
        return False

    def add(self, entity: str, stage: str, reason: str) -> None:
        """Hold ``entity``'s decisions back; ``stage`` is encode, topic or send."""
        self._until[entity] = monotonic_s() + self.hold_s
        self.fresh.add(entity)
        log.warning(
            "decision_quarantined",
            partition=self.partition,
            entity=entity,
            stage=stage,
            reason=reason,
            retry_in_s=self.hold_s,
        )
        if self.instruments is not None:
            self.instruments.quarantined(stage).inc()

    def take_fresh(self) -> set[str]:
        fresh, self.fresh = self.fresh, set()
        return fresh

    def __len__(self) -> int:
        return len(self._until)


class _Refused(Exception):
    """Records of these decisions were refused; the transaction is aborted and retried."""

    def __init__(self, reasons: Mapping[str, str]) -> None:
        super().__init__(f"{len(reasons)} decisions refused")
        self.reasons = dict(reasons)


async def transact(
    producer: AIOKafkaProducer,
    outgoing: Sequence[Outgoing],
    *,
    offset: tuple[TopicPartition, int, str] | None,
    quarantine: Quarantine,
    ensure_queues: EnsureQueues,
) -> list[Outgoing]:
    """Send ``outgoing`` (and the consumer ``offset``, if any) atomically; returns what was sent.

    ``offset`` is (events partition, next offset, group id). Raises on anything that is not one
    decision's fault: the caller fails the step and nothing of it is committed.
    """
    queues = {o.queue for o in outgoing if o.queue is not None}
    refused = await ensure_queues(queues) if queues else {}
    for o in outgoing:
        if o.queue is None or o.queue not in refused or o.decision is None:
            continue
        if not quarantine.holds(o.decision):
            quarantine.add(o.decision, "topic", refused[o.queue])
    records = [o for o in outgoing if o.decision is None or not quarantine.holds(o.decision)]
    for attempt in range(1, TRANSACTION_TRIES + 1):
        try:
            await _send_all(producer, records, offset)
        except _Refused as exc:
            for decision, reason in exc.reasons.items():
                quarantine.add(decision, "send", reason)
            records = [o for o in records if o.decision not in exc.reasons]
            if attempt == TRANSACTION_TRIES:
                raise RuntimeError(f"records refused in {attempt} transactions in a row") from exc
            continue
        return records
    raise AssertionError("unreachable")  # pragma: no cover


async def _send_all(
    producer: AIOKafkaProducer,
    records: Sequence[Outgoing],
    offset: tuple[TopicPartition, int, str] | None,
) -> None:
    refused: dict[str, str] = {}
    async with producer.transaction():
        acks: list[tuple[Outgoing | None, Awaitable[object]]] = []
        for o in records:
            if o.decision in refused:
                continue
            try:
                ack = await producer.send(
                    o.topic, o.value, key=o.key, partition=o.partition, headers=list(o.headers)
                )
            except RECORD_REFUSED as exc:
                if o.decision is None:
                    raise
                refused[o.decision] = repr(exc)
                continue
            acks.append((o, ack))
        if offset is not None:
            # The offset commit goes out while the records are in flight (one round trip less
            # per step); the transaction commits once both are acknowledged.
            tp, next_offset, group_id = offset
            acks.append((None, producer.send_offsets_to_transaction({tp: next_offset}, group_id)))
        # Every ack is awaited (a zombie's fenced transaction fails them all: none is left
        # unretrieved); a failure aborts the transaction.
        outcomes = await asyncio.gather(*(ack for _, ack in acks), return_exceptions=True)
        for (sent, _), outcome in zip(acks, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                continue
            if sent is None or sent.decision is None or not isinstance(outcome, RECORD_REFUSED):
                raise outcome
            refused[sent.decision] = repr(outcome)
        if refused:
            raise _Refused(refused)
