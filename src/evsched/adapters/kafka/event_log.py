"""The EventLog on Kafka: an idempotent producer whose errors leave it as PublishError."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from evsched.adapters.kafka.atomic_batch import AtomicWriter, appended
from evsched.adapters.kafka.clients import (
    STOP_TIMEOUT_S,
    KafkaError,
    is_fatal_producer_error,
    start_producer,
    stop_producer,
)
from evsched.adapters.kafka.fatal_retry import FatalRetry
from evsched.adapters.kafka.partition_log import partition_for
from evsched.adapters.kafka.replicas import ReplicaCheck, acknowledged, describe_partitions
from evsched.errors import NotEnoughReplicas, PublishError
from evsched.ports import Appended, Outbound
from evsched.settings import Settings

# The longest an append waits for its ack: twice the producer's request timeout, so a request
# to a leader that froze can time out and go to the new leader within it. A partition that cannot
# take writes at all (no leader, too few replicas in sync) fails the append sooner, naming why.
ACK_TIMEOUT_S = 60.0


class KafkaEventLog:
    """An idempotent aiokafka producer, replaced by a new one after a fatal producer error.

    Bound to the event loop it starts on, like every aiokafka client. An append returns within
    ``ack_timeout_s``: acknowledged, or PublishError (NotEnoughReplicas as soon as the record's
    partition is seen to have no leader or too few replicas in sync); the producer never gives
    up on an idempotent record by itself.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        client_id: str,
        ack_timeout_s: float = ACK_TIMEOUT_S,
        producer_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._settings = settings
        self._ack_timeout_s = ack_timeout_s
        # aiokafka options over the producer's own (linger_ms: bench/enqueue_path.py compares).
        self._producer_options = dict(producer_options or {})
        self._replicas = ReplicaCheck(lambda topic: describe_partitions(settings, topic))
        self._client_id = client_id
        self._producer: Any = None
        # Records whose appends gave up on them because their partition lacked replicas, as long
        # as the producer holds them: closing then drops what it holds at once (they could not
        # land before the brokers return). One that lands (or fails) leaves: the brokers are back,
        # and closing waits for later appends in flight as it would without the refusal.
        self._refused: set[asyncio.Future[Any]] = set()
        self._lock = asyncio.Lock()
        self._atomic = AtomicWriter(settings, client_id=client_id)
        self._retry = FatalRetry(
            current=self._current,
            discard=self._discard,
            errors=(KafkaError,),
            is_fatal=lambda _producer, exc: is_fatal_producer_error(exc),
            why=repr,
        )

    async def start(self) -> None:
        await self._current()

    async def close(self) -> None:
        await self._atomic.close()
        async with self._lock:
            old, self._producer = self._producer, None
        if old is not None:
            await stop_producer(old, 0.0 if self._refused else STOP_TIMEOUT_S)

    async def append(
        self, topic: str, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Appended:
        async def send(current: Any) -> Appended:
            # The send is inside the bound too: while a partition cannot take writes, a send
            # waits for room behind the record before it (30 s, then KafkaTimeoutError).
            sent = _sent(current, topic, value, key, headers)
            return appended(topic, await self._acknowledged(current, sent, topic, key))

        return await self._retry.append(topic, send)

    async def append_many(
        self, topic: str, records: Sequence[Outbound]
    ) -> list[Appended | PublishError]:
        """Hands every record to the producer before waiting for any ack: batched on the wire."""
        current = await self._current()
        futures: list[Any] = []
        for r in records:
            try:
                sent = await current.send(topic, r.value, key=r.key.encode(), partition=r.partition)
            except KafkaError as exc:
                sent = exc
            futures.append(sent)
        results: list[Appended | PublishError] = []
        fatal = False
        for future in futures:
            try:
                if isinstance(future, KafkaError):
                    raise future
                results.append(appended(topic, await future))
            except KafkaError as exc:
                fatal = fatal or is_fatal_producer_error(exc)
                results.append(PublishError(f"writing to {topic!r} failed: {exc!r}"))
        if fatal:  # the next call gets a fresh producer; these records are reported as failed
            await self._discard(current)
        return results

    async def append_atomic(self, topic: str, records: Sequence[Outbound]) -> list[Appended]:
        return await self._atomic.write(topic, records)

    async def partition_count(self, topic: str) -> int:
        current = await self._current()
        try:
            found = await current.partitions_for(topic)
        except KafkaError as exc:
            raise PublishError(f"cannot read the partitions of {topic!r}: {exc!r}") from exc
        return len(found)

    async def _acknowledged(self, current: Any, future: Any, topic: str, key: str) -> Any:
        """The ack, within the timeout; NotEnoughReplicas once the partition cannot take it."""

        async def problem() -> str | None:
            count = len(await current.partitions_for(topic))
            return await self._replicas.problem(topic, partition_for(key, count))

        sending = asyncio.ensure_future(future)
        try:
            return await acknowledged(
                sending,
                what=f"writing to {topic!r}",
                timeout_s=self._ack_timeout_s,
                problem=problem,
            )
        except NotEnoughReplicas:
            if not sending.done():  # held by the producer until it lands or is dropped
                self._refused.add(sending)
                sending.add_done_callback(self._refused.discard)
            raise

    async def _current(self) -> Any:
        if (ready := self._producer) is not None:
            return ready  # the lock only orders making and discarding one
        async with self._lock:
            if self._producer is None:
                self._producer = await start_producer(
                    self._settings, client_id=self._client_id, **self._producer_options
                )
            return self._producer

    async def _discard(self, broken: Any) -> None:
        async with self._lock:
            if self._producer is broken:
                self._producer = None
        await stop_producer(broken)


async def _sent(
    producer: Any, topic: str, value: bytes, key: str, headers: Sequence[tuple[str, bytes]] = ()
) -> Any:
    """The record's metadata once the producer took it and the broker acknowledged it."""
    if headers:  # a worker's proof (adapters.proofs); most records carry none
        future = await producer.send(topic, value, key=key.encode(), headers=list(headers))
    else:
        future = await producer.send(topic, value, key=key.encode())
    return await future
