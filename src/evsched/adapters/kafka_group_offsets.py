"""The offsets a consumer group committed, read through an admin client without joining it."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from evsched.errors import BrokerUnavailable
from evsched.settings import Settings


class GroupOffsets:
    """Asks the coordinator of ``group_id`` what it committed on ``topic``, over one admin
    client started on the first ask and kept until :meth:`close` (a failed ask drops it)."""

    def __init__(
        self, settings: Settings, group_id: str, topic: str, *, timeout_s: float = 5.0
    ) -> None:
        self._settings = settings
        self.group_id = group_id
        self.topic = topic
        self._timeout_s = timeout_s
        self._admin: AIOKafkaAdminClient | None = None

    async def committed(self) -> dict[int, int]:
        """Partition -> the group's committed offset (partitions never committed are missing)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                admin = await self._started()
                found = await admin.list_consumer_group_offsets(self.group_id)
        except (KafkaError, TimeoutError, OSError) as exc:
            await self.close()
            raise BrokerUnavailable(
                f"cannot read the offsets of consumer group {self.group_id}: {exc!r}"
            ) from exc
        return {
            tp.partition: meta.offset
            for tp, meta in found.items()
            if tp.topic == self.topic and meta.offset >= 0
        }

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()

    async def _started(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                bootstrap_servers=self._settings.bootstrap,
                request_timeout_ms=int(self._timeout_s * 1000),
                **dict(self._settings.kafka_options),
            )
            try:
                await admin.start()
            except BaseException:
                await admin.close()
                raise
            self._admin = admin
        return self._admin
