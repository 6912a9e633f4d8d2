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

# How long a decision that could not be encoded or sent is held back before it is planned again
# (one on an undeclared queue: as long as QueueTopics waits to look again):
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

# How long a step waits for a dispatch topic's metadata before quarantining its decisions.
METADATA_WAIT_S = 10.0

# Transactions tried per step while records are refused; each failed try finds or quarantines at
# least one culprit, so a step never loops.
TRANSACTION_TRIES = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Unusable:
    """Why a queue's dispatch topic can't be sent to now: its decisions are held back."""

    stage: str  # undeclared (no topic: an operator declares the queue) or topic (misconfigured)
    reason: str
    hold_s: float | None = None  # how long its decisions are held; None: QUARANTINE_S


# Checks the dispatch topics of ``queues``; returns those that can't be used now, and why.
EnsureQueues = Callable[[set[str]], Awaitable[Mapping[str, Unusable]]]


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
        # Decisions that shared a batch the broker refused: sent one by one to find the culprit.
        self.suspects: set[str] = set()

    def holds(self, entity: str) -> bool:
        until = self._until.get(entity)
        if until is None:
            return False
        if until > monotonic_s():
            return True
        del self._until[entity]
        return False

    def add(
        self,
        entity: str,
        stage: str,
        reason: str,
        *,
        hold_s: float | None = None,
        quiet: bool = False,
    ) -> None:
        """Hold ``entity``'s decisions back; ``stage`` is encode, topic, undeclared or send.

        ``quiet``: the cause is logged elsewhere, once for many decisions (an undeclared queue).
        """
        hold_s = self.hold_s if hold_s is None else hold_s
        self.suspects.discard(entity)
        self._until[entity] = monotonic_s() + hold_s
        self.fresh.add(entity)
        if not quiet:
            log.warning(
                "decision_quarantined",
                partition=self.partition,
                entity=entity,
                stage=stage,
                reason=reason,
                retry_in_s=hold_s,
            )
        if self.instruments is not None:
            self.instruments.quarantined(stage).inc()

    def first_release_ms(self, now: int) -> int | None:
        """When the first held decision may be planned again, as an epoch-ms time."""
        clock = monotonic_s()
        released = [e for e, until in self._until.items() if until <= clock]
        for entity in released:
            del self._until[entity]  # released: planned again like any job
        if released:
            # Released since the step's plan skipped them: plan again now, or nothing would
            # (no record may come to wake the partition).
            return now
        if not self._until:
            return None
        return now + max(0, int((min(self._until.values()) - clock) * 1000))

    def take_fresh(self) -> set[str]:
        fresh, self.fresh = self.fresh, set()
        return fresh

    def __len__(self) -> int:
        return len(self._until)


class _Refused(Exception):
    """Records of these decisions were refused; the transaction is aborted and retried.

    ``exact`` when each decision's own record was refused; otherwise the broker refused a batch
    that held them all, and only one of them may be at fault.
    """

    def __init__(self, reasons: Mapping[str, str], *, exact: bool, spoiled: bool) -> None:
        super().__init__(f"{len(reasons)} decisions refused")
        self.reasons = dict(reasons)
        self.exact = exact or len(reasons) == 1
        self.spoiled = spoiled  # by the broker: the producer's sequence numbers are broken


class ProducerSpoiled(Exception):
    """The broker refused a batch: the idempotent producer must be replaced before a retry.

    (Its sequence numbers count the refused batch; the next send would fail with
    OutOfOrderSequenceNumber.) The culprits are already quarantined or marked as suspects.
    """


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
    refused = await _unusable_queues(producer, outgoing, ensure_queues)
    for o in outgoing:
        if o.queue is None or o.queue not in refused or o.decision is None:
            continue
        if not quarantine.holds(o.decision):
            why = refused[o.queue]
            quiet = why.stage == "undeclared"  # QueueTopics logs queue_undeclared instead
            quarantine.add(o.decision, why.stage, why.reason, hold_s=why.hold_s, quiet=quiet)
    records = [o for o in outgoing if o.decision is None or not quarantine.holds(o.decision)]
    for attempt in range(1, TRANSACTION_TRIES + 1):
        try:
            await _send_all(producer, records, offset, quarantine.suspects)
        except _Refused as exc:
            if attempt == TRANSACTION_TRIES:
                raise RuntimeError(f"records refused in {attempt} transactions in a row") from exc
            if exc.exact:
                for decision, reason in exc.reasons.items():
                    quarantine.add(decision, "send", reason)
                records = [o for o in records if o.decision not in exc.reasons]
            else:
                quarantine.suspects |= exc.reasons.keys()
            if exc.spoiled:
                raise ProducerSpoiled(str(exc)) from exc
            continue
        return records
    raise AssertionError("unreachable")  # pragma: no cover


async def _unusable_queues(
    producer: AIOKafkaProducer, outgoing: Sequence[Outgoing], ensure_queues: EnsureQueues
) -> dict[str, Unusable]:
    """Queues whose dispatch topic can't be used now (undeclared, refused, no metadata), and why."""
    topics = {o.queue: o.topic for o in outgoing if o.queue is not None}
    refused = dict(await ensure_queues(set(topics))) if topics else {}
    waits: tuple[type[BaseException], ...] = (TimeoutError, *RECORD_REFUSED)
    for queue, topic in topics.items():
        if queue in refused:
            continue
        # Before the transaction, not inside it: a topic just created may take a moment to reach
        # the producer's metadata, and send() would wait for it holding the step.
        try:
            await asyncio.wait_for(producer.partitions_for(topic), METADATA_WAIT_S)
        except waits as exc:
            reason = f"no metadata for {topic} after {METADATA_WAIT_S} s: {exc!r}"
            refused[queue] = Unusable(stage="topic", reason=reason)
    return refused


async def _send_all(
    producer: AIOKafkaProducer,
    records: Sequence[Outgoing],
    offset: tuple[TopicPartition, int, str] | None,
    suspects: set[str],
) -> None:
    async with producer.transaction():
        # Suspects go first, each in a batch of its own: the first one refused is the culprit
        # (and the transaction, now failed, is aborted at once).
        for o in records:
            if o.decision in suspects:
                try:
                    await (await _send(producer, o))
                except RECORD_REFUSED as exc:
                    raise _Refused({o.decision: repr(exc)}, exact=True, spoiled=True) from None
        rest = [o for o in records if o.decision not in suspects]
        await _send_batched(producer, rest, offset)


async def _send_batched(
    producer: AIOKafkaProducer,
    records: Sequence[Outgoing],
    offset: tuple[TopicPartition, int, str] | None,
) -> None:
    refused: dict[str, str] = {}  # by send() itself: about this record alone
    acks: list[tuple[Outgoing | None, Awaitable[object]]] = []
    for o in records:
        if o.decision in refused:
            continue
        try:
            acks.append((o, await _send(producer, o)))
        except RECORD_REFUSED as exc:
            if o.decision is None:
                raise
            refused[o.decision] = repr(exc)
    if offset is not None:
        # The offset commit goes out while the records are in flight (one round trip less per
        # step); the transaction commits once both are acknowledged.
        tp, next_offset, group_id = offset
        acks.append((None, producer.send_offsets_to_transaction({tp: next_offset}, group_id)))
    # Every ack is awaited (a zombie's fenced transaction fails them all: none is left
    # unretrieved); a failure aborts the transaction.
    outcomes = await asyncio.gather(*(ack for _, ack in acks), return_exceptions=True)
    in_batch = _refused_acks([sent for sent, _ in acks], outcomes)
    if in_batch:
        raise _Refused(in_batch, exact=False, spoiled=True)
    if refused:
        raise _Refused(refused, exact=True, spoiled=False)


def _refused_acks(sent: Sequence[Outgoing | None], outcomes: Sequence[object]) -> dict[str, str]:
    """Decisions whose records the broker refused; raises any other failure.

    Once a batch is refused, the producer's later batches to that partition fail too (out of
    sequence): collateral, retried with a new producer, never the cause of a failed step.
    """
    refused: dict[str, str] = {}
    other: BaseException | None = None
    for o, outcome in zip(sent, outcomes, strict=True):
        if not isinstance(outcome, BaseException):
            continue
        if o is not None and o.decision is not None and isinstance(outcome, RECORD_REFUSED):
            refused[o.decision] = repr(outcome)
        elif other is None:
            other = outcome
    if other is not None and not refused:
        raise other
    return refused


async def _send(producer: AIOKafkaProducer, o: Outgoing) -> Awaitable[object]:
    ack: Awaitable[object] = await producer.send(
        o.topic, o.value, key=o.key, partition=o.partition, headers=list(o.headers)
    )
    return ack
