"""The partition outbox on Kafka: one step's records and consumer offset in one transaction.

A record the broker refuses (too large, its topic missing or not allowed, no metadata in time)
holds back its decision only: the transaction is aborted and sent again without it. A refused
batch spoils the idempotent producer (its sequence numbers count the refused batch), so the
outbox replaces it with a new one under the same transactional id, whose epoch aborts the old
transaction. aiokafka's errors stop here: ``Fenced``, ``RecordRefused``, ``BrokerUnavailable``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFenced,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
from aiokafka.structs import TopicPartition

from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.topics import STATE_MAX_MESSAGE_BYTES
from evsched.errors import BrokerUnavailable, Fenced, RecordRefused
from evsched.ports import ConsumerOffset, Holdback, Outgoing
from evsched.settings import Settings

# Errors about one record rather than the producer or the broker.
REFUSED_BY_BROKER: tuple[type[BaseException], ...] = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    InvalidTopicError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
)
# ... and send() giving up waiting for the topic's metadata: its decision is held back too.
RECORD_REFUSED: tuple[type[BaseException], ...] = (*REFUSED_BY_BROKER, KafkaTimeoutError)

# How long a step waits for a dispatch topic's metadata before holding its decisions back.
METADATA_WAIT_S = 10.0

# Transactions tried per producer while records are refused, and producers per send; each failed
# try finds or holds back at least one culprit, so a send never loops.
TRANSACTION_TRIES = 5

# The largest batch of records the producer builds per partition. aiokafka sends one batch per
# partition per produce request and keeps one request in flight per broker, so with its default
# (16 KiB) a step's changelog of a few hundred records took a produce round trip per 16 KiB,
# one after the other. Kept under Kafka's default max.message.bytes (1 MiB), which limits a
# batch of the events and dispatch topics as a whole; a single larger record still goes alone.
BATCH_BYTES = 512 << 10


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


class _Spoiled(Exception):
    """The broker refused a batch: the producer must be replaced before a retry."""


class KafkaOutbox:
    """The :class:`~evsched.ports.PartitionOutbox` over a transactional producer of a partition."""

    def __init__(self, settings: Settings, *, transactional_id: str, client_id: str) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self.client_id = client_id
        self._producer: AIOKafkaProducer | None = None
        # Decisions that shared a batch the broker refused: sent one by one to find the culprit.
        self.suspects: set[str] = set()

    async def start(self) -> None:
        """Start the producer: its transactional id fences any older owner's producer."""
        try:
            self._producer = await self._new_producer()
        except KafkaError as exc:
            raise _mapped(exc) from exc

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            # Within kafka.stop_producer's bound: while too few replicas are in sync, the
            # producer would hold its transaction's records for as long as that lasts. What it
            # leaves, the next producer of this transactional id aborts when it starts.
            with contextlib.suppress(Exception):
                await kafka.stop_producer(producer)

    async def send(
        self, outgoing: Sequence[Outgoing], *, offset: ConsumerOffset | None, holdback: Holdback
    ) -> list[Outgoing]:
        try:
            return await self._send(outgoing, offset, holdback)
        except KafkaError as exc:
            raise _mapped(exc) from exc

    async def _send(
        self, outgoing: Sequence[Outgoing], offset: ConsumerOffset | None, holdback: Holdback
    ) -> list[Outgoing]:
        """One transaction; after a refused batch, again with a new producer, without culprits."""
        for _ in range(TRANSACTION_TRIES):
            try:
                return await self._transact(outgoing, offset, holdback)
            except _Spoiled:
                await self.close()
                # Same transactional id: the new producer's epoch aborts the old transaction.
                self._producer = await self._new_producer()
        raise RecordRefused(f"records refused in {TRANSACTION_TRIES} transactions in a row")

    async def _new_producer(self) -> AIOKafkaProducer:
        producer = kafka.producer(
            self.settings,
            client_id=self.client_id,
            transactional_id=self.transactional_id,
            # Changelog records may exceed an event's size (topics.STATE_MAX_MESSAGE_BYTES);
            # each topic's own max.message.bytes still refuses what it does not take.
            max_request_size=STATE_MAX_MESSAGE_BYTES + (64 << 10),
            max_batch_size=BATCH_BYTES,
            # Dispatch records are spread by key over every partition the producer knows of:
            # partitions added to a dispatch topic take work within this.
            metadata_max_age_ms=kafka.GROWTH_NOTICE_MS,
        )
        try:
            await producer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        return producer

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise BrokerUnavailable(f"outbox {self.transactional_id} is not started")
        return self._producer

    async def _transact(
        self, outgoing: Sequence[Outgoing], offset: ConsumerOffset | None, holdback: Holdback
    ) -> list[Outgoing]:
        await self._hold_without_metadata(outgoing, holdback)
        records = [o for o in outgoing if o.decision is None or not holdback.holds(o.decision)]
        for attempt in range(1, TRANSACTION_TRIES + 1):
            try:
                await self._send_all(records, offset)
            except _Refused as exc:
                if attempt == TRANSACTION_TRIES:
                    raise RecordRefused(f"records refused in {attempt} transactions") from exc
                if exc.exact:
                    for decision, reason in exc.reasons.items():
                        self.suspects.discard(decision)
                        holdback.add(decision, "send", reason)
                    records = [o for o in records if o.decision not in exc.reasons]
                else:
                    self.suspects |= exc.reasons.keys()
                if exc.spoiled:
                    raise _Spoiled(str(exc)) from exc
                continue
            return records
        raise AssertionError("unreachable")  # pragma: no cover

    async def _hold_without_metadata(
        self, outgoing: Sequence[Outgoing], holdback: Holdback
    ) -> None:
        """Hold back decisions whose dispatch topic's metadata does not come in time."""
        topics = {o.queue: o.topic for o in outgoing if o.queue is not None}
        waits: tuple[type[BaseException], ...] = (TimeoutError, *RECORD_REFUSED)
        unusable: dict[str, str] = {}
        for queue, topic in topics.items():
            # Before the transaction, not inside it: a topic just created may take a moment to
            # reach the producer's metadata, and send() would wait for it holding the step.
            try:
                await asyncio.wait_for(self.producer.partitions_for(topic), METADATA_WAIT_S)
            except waits as exc:
                unusable[queue] = f"no metadata for {topic} after {METADATA_WAIT_S} s: {exc!r}"
        for o in outgoing:
            if o.queue in unusable and o.decision is not None and not holdback.holds(o.decision):
                holdback.add(o.decision, "topic", unusable[o.queue])

    async def _send_all(self, records: Sequence[Outgoing], offset: ConsumerOffset | None) -> None:
        producer = self.producer
        async with producer.transaction():
            # Suspects go first, each in a batch of its own: the first one refused is the culprit
            # (and the transaction, now failed, is aborted at once).
            for o in records:
                if o.decision in self.suspects:
                    try:
                        await (await _send(producer, o))
                    except RECORD_REFUSED as exc:
                        raise _Refused({o.decision: repr(exc)}, exact=True, spoiled=True) from None
            rest = [o for o in records if o.decision not in self.suspects]
            await _send_batched(producer, rest, offset)


async def _send_batched(
    producer: AIOKafkaProducer, records: Sequence[Outgoing], offset: ConsumerOffset | None
) -> None:
    refused: dict[str, str] = {}  # by send() itself: about this record alone
    bulk = _bulk_topics(records)
    acks = await _send_bulk(producer, [o for o in records if o.topic in bulk])
    for o in records:
        if o.decision in refused or o.topic in bulk:
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
        tp = TopicPartition(offset.topic, offset.partition)
        sent = producer.send_offsets_to_transaction({tp: offset.next_offset}, offset.group_id)
        acks.append((None, sent))
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


def _bulk_topics(records: Sequence[Outgoing]) -> set[str]:
    """Topics whose every record here has its partition and no decision or headers (the state
    changelog's): they go as whole batches, with one ack per batch instead of per record.

    A topic any other record goes to is left to ``send()``, so order per partition holds.
    """
    bulk: set[str] = set()
    other: set[str] = set()
    for o in records:
        plain = o.partition is not None and o.decision is None and not o.headers
        (bulk if plain else other).add(o.topic)
    return bulk - other


async def _send_bulk(
    producer: AIOKafkaProducer, records: Sequence[Outgoing]
) -> list[tuple[Outgoing | None, Awaitable[object]]]:
    """``records`` in batches per partition, in order; the batches' acks."""
    acks: list[tuple[Outgoing | None, Awaitable[object]]] = []
    batches: dict[tuple[str, int], Any] = {}
    for o in records:
        assert o.partition is not None
        where = (o.topic, o.partition)
        batch = batches.get(where)
        if batch is not None and batch.append(key=o.key, value=o.value, timestamp=None) is not None:
            continue
        if batch is not None:  # full: on its way, and a new one for the rest
            acks.append((None, await producer.send_batch(batch, o.topic, partition=o.partition)))
        batch = batches[where] = producer.create_batch()
        # The first record always goes in, even one larger than a batch.
        batch.append(key=o.key, value=o.value, timestamp=None)
    for (topic, partition), batch in batches.items():
        acks.append((None, await producer.send_batch(batch, topic, partition=partition)))
    return acks


async def _send(producer: AIOKafkaProducer, o: Outgoing) -> Awaitable[object]:
    ack: Awaitable[object] = await producer.send(
        o.topic, o.value, key=o.key, partition=o.partition, headers=list(o.headers)
    )
    return ack


def _mapped(exc: KafkaError) -> Exception:
    """evsched's error for a Kafka client's error that ends a send."""
    if isinstance(exc, ProducerFenced):
        return Fenced(f"a newer owner took the transactional id: {exc!r}")
    if isinstance(exc, REFUSED_BY_BROKER):
        return RecordRefused(repr(exc))
    return BrokerUnavailable(repr(exc))
