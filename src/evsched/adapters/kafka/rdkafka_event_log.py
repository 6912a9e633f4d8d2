"""The EventLog on librdkafka (confluent-kafka): KafkaEventLog's promises on another client.

The default client (``event_log_factory``; ``EVSCHED_KAFKA_CLIENT=aiokafka`` picks the other).
Same bounds and errors as ``event_log.KafkaEventLog``: an append returns within ``ack_timeout_s``
(give or take ``ack_watch.TICK_S``), acknowledged or PublishError (NotEnoughReplicas when its
partition cannot take writes), a fatal producer error makes a new producer, and the ack carries
the LogAppendTime. The bound is one ``AckWatch`` for all appends, not a timer per append.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, KafkaException, Message

from evsched.adapters.kafka.ack_watch import AckWatch
from evsched.adapters.kafka.clients import STOP_TIMEOUT_S
from evsched.adapters.kafka.fatal_retry import FatalRetry
from evsched.adapters.kafka.partition_log import partition_for
from evsched.adapters.kafka.rdkafka_atomic import RdkafkaAtomicWriter
from evsched.adapters.kafka.rdkafka_producer import PolledProducer, producer_config
from evsched.adapters.kafka.replicas import ReplicaCheck, describe_partitions
from evsched.errors import PublishError
from evsched.ports import Appended, Outbound
from evsched.settings import Settings

ACK_TIMEOUT_S = 60.0  # as event_log.ACK_TIMEOUT_S


def appended(topic: str, msg: Message) -> Appended:
    kind, at = msg.timestamp()
    partition, offset = msg.partition(), msg.offset()
    assert partition is not None and offset is not None, "an acknowledged record has both"
    return Appended(topic, partition, offset, at if kind == TIMESTAMP_LOG_APPEND_TIME else None)


class RdkafkaEventLog:
    """An idempotent confluent-kafka producer, replaced by a new one after a fatal error.

    Bound to the event loop it starts on (its acks are that loop's futures).
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
        # librdkafka properties over the producer's own; settings it cannot take refuse here.
        self._config = producer_config(settings, client_id=client_id, **(producer_options or {}))
        self._replicas = ReplicaCheck(lambda topic: describe_partitions(settings, topic))
        self._producer: PolledProducer | None = None
        # As KafkaEventLog._refused: acks given up on for want of replicas whose records the
        # producer still holds (it reports each one: PolledProducer.on_late), dropped at close.
        self._refused: set[asyncio.Future[Any]] = set()
        self._watch = AckWatch(
            self._problems, timeout_s=ack_timeout_s, on_refused=self._refused.add
        )
        self._lock = asyncio.Lock()
        self._atomic = RdkafkaAtomicWriter(settings, client_id=client_id)
        self._retry = FatalRetry(
            current=self._current,
            discard=self._discard,
            errors=(KafkaException, BufferError),
            is_fatal=lambda producer, exc: producer.is_fatal(exc),
            why=_why,
        )

    async def start(self) -> None:
        await self._current()

    async def close(self) -> None:
        self._watch.close()
        await self._atomic.close()
        async with self._lock:
            old, self._producer = self._producer, None
        if old is not None:
            await old.close(0.0 if self._refused else STOP_TIMEOUT_S)

    async def append(
        self, topic: str, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Appended:
        async def send(current: PolledProducer) -> Appended:
            sent = current.send(topic, key.encode(), value, headers=headers)
            self._watch.watch(sent, topic, key)
            return appended(topic, await sent)

        return await self._retry.append(topic, send)

    async def append_many(
        self, topic: str, records: Sequence[Outbound]
    ) -> list[Appended | PublishError]:
        """Queues every record before waiting for any ack: batched on the wire."""
        current = await self._current()
        sent: list[asyncio.Future[Message] | BaseException] = []
        for r in records:
            try:
                sent.append(current.send(topic, r.key.encode(), r.value, partition=r.partition))
            except (KafkaException, BufferError) as exc:
                sent.append(exc)
        results: list[Appended | PublishError] = []
        fatal = False
        for one in sent:
            try:
                if isinstance(one, BaseException):
                    raise one
                results.append(appended(topic, await one))
            except (KafkaException, BufferError) as exc:
                fatal = fatal or current.is_fatal(exc)
                results.append(PublishError(f"writing to {topic!r} failed: {_why(exc)}"))
        if fatal:  # the next call gets a fresh producer; these records are reported as failed
            await self._discard(current)
        return results

    async def append_atomic(self, topic: str, records: Sequence[Outbound]) -> list[Appended]:
        return [appended(topic, m) for m in await self._atomic.write(topic, records)]

    async def partition_count(self, topic: str) -> int:
        current = await self._current()
        try:
            return await current.partition_count(topic)
        except KafkaException as exc:
            raise PublishError(f"cannot read the partitions of {topic!r}: {_why(exc)}") from exc

    async def _problems(self, topic: str, keys: list[str]) -> list[str | None]:
        """For AckWatch: why each key's partition cannot take writes now (None: it can).

        The partition count comes from the same describe as the replicas, not from the
        producer: librdkafka's ``list_topics`` is a metadata request of its own, and right
        after a broker died it went unanswered for 25 s, so no look could name a cause.
        """
        found = await self._replicas.partitions(topic)
        if not found:
            return [None] * len(keys)
        count = len(found)
        problems = {p: d.problem() for p, d in found.items()}
        return [problems.get(partition_for(key, count)) for key in keys]

    async def _current(self) -> PolledProducer:
        if (ready := self._producer) is not None:
            return ready  # the lock only orders making and discarding one
        async with self._lock:
            if self._producer is None:
                fresh = PolledProducer(self._config, bootstrap=self._settings.bootstrap)
                fresh.on_late = self._refused.discard
                try:
                    await fresh.start()
                except PublishError:
                    await fresh.close(0.0)
                    raise
                self._producer = fresh
            return self._producer

    async def _discard(self, broken: PolledProducer) -> None:
        async with self._lock:
            if self._producer is broken:
                self._producer = None
        await broken.close(0.0)


def _why(exc: BaseException) -> str:
    """librdkafka's own words for a failure (its KafkaError's str), else the exception's repr."""
    if isinstance(exc, KafkaException) and exc.args and hasattr(exc.args[0], "str"):
        return str(exc.args[0].str())
    return repr(exc)
