"""Atomic batches of events: one transactional producer, used only for all-or-none writes.

A transactional producer costs a coordinator round trip per transaction and fences its earlier
incarnations by id, so it is made lazily, once per client, only when an atomic batch is asked
for; plain enqueues keep the idempotent producer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from evsched.adapters.ids import new_id
from evsched.adapters.kafka.clients import KafkaError, start_producer, stop_producer
from evsched.errors import PublishError
from evsched.ports import Appended, Outbound
from evsched.settings import Settings

LOG_APPEND_TIME = 1


def batch_id_prefix(namespace: str) -> str:
    """What every atomic writer's transactional id in ``namespace`` starts with (its ACL)."""
    return f"{namespace}.batch."


def batch_transactional_id(namespace: str, client_id: str) -> str:
    """A new writer's id: unique, so two clients never fence each other's batches, and under
    the namespace's prefix, so one prefixed ACL lets producers and the API write batches."""
    return f"{batch_id_prefix(namespace)}{client_id}.{new_id()}"


def appended(topic: str, metadata: Any) -> Appended:
    log_at = metadata.timestamp if metadata.timestamp_type == LOG_APPEND_TIME else None
    return Appended(topic, metadata.partition, metadata.offset, log_at)


class AtomicWriter:
    """Writes a batch of records in one Kafka transaction; one transaction at a time."""

    def __init__(self, settings: Settings, *, client_id: str) -> None:
        self._settings = settings
        self._client_id = client_id
        self._producer: Any = None
        self._lock = asyncio.Lock()

    async def write(self, topic: str, records: Sequence[Outbound]) -> list[Appended]:
        async with self._lock:
            current = await self._current()
            try:
                async with current.transaction():
                    futures = [
                        await current.send(
                            topic, r.value, key=r.key.encode(), partition=r.partition
                        )
                        for r in records
                    ]
                metadata = [await f for f in futures]
            except KafkaError as exc:
                # Whatever state the transaction is in, a new producer (same id) aborts it.
                await self._drop()
                raise PublishError(f"atomic batch to {topic!r} failed: {exc!r}") from exc
        return [appended(topic, m) for m in metadata]

    async def close(self) -> None:
        async with self._lock:
            await self._drop()

    async def _current(self) -> Any:
        if self._producer is None:
            self._producer = await start_producer(
                self._settings,
                client_id=self._client_id,
                transactional_id=batch_transactional_id(self._settings.namespace, self._client_id),
            )
        return self._producer

    async def _drop(self) -> None:
        old, self._producer = self._producer, None
        if old is not None:
            await stop_producer(old)
