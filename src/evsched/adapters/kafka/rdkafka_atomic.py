"""Atomic batches on librdkafka: one transactional producer, one transaction at a time.

As ``atomic_batch.AtomicWriter``: made lazily, under the namespace's batch id prefix (its ACL).
librdkafka's transaction calls block, so a whole transaction runs on a worker thread; its
delivery reports are served by ``commit_transaction`` on that same thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from evsched.adapters.kafka.atomic_batch import batch_transactional_id
from evsched.adapters.kafka.rdkafka_producer import CLIENT_LOGGER, producer_config
from evsched.errors import PublishError
from evsched.ports import Outbound
from evsched.settings import Settings

# What one transaction call may take (init, commit, abort); the broker aborts a transaction
# left open for TRANSACTION_TIMEOUT_MS.
CALL_TIMEOUT_S = 30.0
TRANSACTION_TIMEOUT_MS = 60_000


class RdkafkaAtomicWriter:
    """Writes a batch of records in one Kafka transaction; the acknowledged Messages in order."""

    def __init__(self, settings: Settings, *, client_id: str) -> None:
        self._settings = settings
        self._client_id = client_id
        self._producer: Producer | None = None
        self._lock = asyncio.Lock()

    async def write(self, topic: str, records: Sequence[Outbound]) -> list[Message]:
        async with self._lock:
            try:
                current = await self._current()
                return await asyncio.to_thread(_transact, current, topic, records)
            except KafkaException as exc:
                # A new producer (new id) starts clean; the broker aborts what this one left.
                await self._drop()
                raise PublishError(f"atomic batch to {topic!r} failed: {exc.args[0]}") from exc

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _current(self) -> Producer:
        if self._producer is None:
            config = producer_config(
                self._settings,
                client_id=self._client_id,
                **{
                    "transactional.id": batch_transactional_id(
                        self._settings.namespace, self._client_id
                    ),
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "logger": CLIENT_LOGGER,
                },
            )
            fresh = Producer(config)
            try:
                await asyncio.to_thread(fresh.init_transactions, CALL_TIMEOUT_S)
            except KafkaException:
                await asyncio.to_thread(_dispose, fresh)
                raise
            self._producer = fresh
        return self._producer

    async def _drop(self) -> None:
        old, self._producer = self._producer, None
        if old is not None:
            await asyncio.to_thread(_dispose, old)


def _transact(producer: Producer, topic: str, records: Sequence[Outbound]) -> list[Message]:
    """Runs on a worker thread: begin, produce, commit; KafkaException when any step fails."""
    reports: list[tuple[KafkaError | None, Message] | None] = [None] * len(records)

    def delivered(index: int, err: KafkaError | None, msg: Message) -> None:
        reports[index] = (err, msg)

    producer.begin_transaction()
    try:
        for i, r in enumerate(records):
            options: dict[str, Any] = {"on_delivery": functools.partial(delivered, i)}
            if r.partition is not None:
                options["partition"] = r.partition
            producer.produce(topic, r.value, r.key.encode(), **options)
        producer.commit_transaction(CALL_TIMEOUT_S)
    except (KafkaException, BufferError) as exc:
        with contextlib.suppress(KafkaException):
            producer.abort_transaction(CALL_TIMEOUT_S)
        if isinstance(exc, BufferError):
            raise KafkaException(KafkaError(KafkaError._QUEUE_FULL, str(exc))) from exc
        raise
    producer.poll(0)  # reports the commit's flush left queued
    messages: list[Message] = []
    for report in reports:
        if report is None or report[0] is not None:
            why = "no delivery report" if report is None else report[0]
            raise KafkaException(KafkaError(KafkaError._FAIL, f"committed, but {why}"))
        messages.append(report[1])
    return messages


def _dispose(producer: Producer) -> None:
    """Closes a producer without waiting for what it still holds (an open transaction aborts)."""
    producer.purge()
    producer.flush(0)
    producer.close()
