"""The offsets a consumer group committed, read through an admin client without joining it."""

from __future__ import annotations

from evsched.adapters.kafka.kept_admin import KeptAdmin
from evsched.settings import Settings


class GroupOffsets:
    """Asks the coordinator of ``group_id`` what it committed on ``topic``, over one admin
    client started on the first ask and kept until :meth:`close` (a failed ask drops it)."""

    def __init__(
        self, settings: Settings, group_id: str, topic: str, *, timeout_s: float = 5.0
    ) -> None:
        self.group_id = group_id
        self.topic = topic
        self._admin = KeptAdmin(settings, timeout_s=timeout_s)

    async def committed(self) -> dict[int, int]:
        """Partition -> the group's committed offset (partitions never committed are missing)."""
        failure = f"cannot read the offsets of consumer group {self.group_id}"
        async with self._admin.ask(failure) as admin:
            found = await admin.list_consumer_group_offsets(self.group_id)
        return {
            tp.partition: meta.offset
            for tp, meta in found.items()
            if tp.topic == self.topic and meta.offset >= 0
        }

    async def close(self) -> None:
        await self._admin.close()
