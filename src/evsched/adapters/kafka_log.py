"""The EventLog on Kafka: an idempotent producer whose errors leave it as PublishError."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from evsched.adapters.kafka import KafkaError, is_fatal_producer_error, producer
from evsched.errors import PublishError
from evsched.ports import Appended
from evsched.settings import Settings

log = structlog.get_logger("evsched.transport")

LOG_APPEND_TIME = 1  # a record's timestamp type when the broker stamped it


class KafkaEventLog:
    """An idempotent aiokafka producer, replaced by a new one after a fatal producer error.

    Bound to the event loop it starts on, like every aiokafka client.
    """

    def __init__(self, settings: Settings, *, client_id: str) -> None:
        self._settings = settings
        self._client_id = client_id
        self._producer: Any = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        await self._current()

    async def close(self) -> None:
        async with self._lock:
            old, self._producer = self._producer, None
        if old is not None:
            await self._stop(old)

    async def append(self, topic: str, key: str, value: bytes) -> Appended:
        for attempt in (1, 2):
            current = await self._current()
            try:
                future = await current.send(topic, value, key=key.encode())
                metadata = await future
            except KafkaError as exc:
                # A fatal error poisons this producer only; the event carries its own event_id,
                # so sending it again through a new producer can at worst make a duplicate
                # that the fold drops.
                if attempt == 1 and is_fatal_producer_error(exc):
                    log.warning("producer_recreated", error=repr(exc), topic=topic)
                    await self._discard(current)
                    continue
                raise PublishError(f"writing to {topic!r} failed: {exc!r}") from exc
            log_at = metadata.timestamp if metadata.timestamp_type == LOG_APPEND_TIME else None
            return Appended(topic, metadata.partition, metadata.offset, log_at)
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _current(self) -> Any:
        async with self._lock:
            if self._producer is None:
                fresh = producer(self._settings, client_id=self._client_id)
                try:
                    await fresh.start()
                except KafkaError as exc:
                    await self._stop(fresh)
                    raise PublishError(
                        f"cannot reach Kafka at {self._settings.bootstrap}: {exc!r}"
                    ) from exc
                self._producer = fresh
            return self._producer

    async def _discard(self, broken: Any) -> None:
        async with self._lock:
            if self._producer is broken:
                self._producer = None
        await self._stop(broken)

    @staticmethod
    async def _stop(spent: Any) -> None:
        try:
            await spent.stop()
        except KafkaError as exc:  # what it had not sent was already reported as a PublishError
            log.warning("producer_stop_failed", error=repr(exc))
