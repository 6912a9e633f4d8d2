"""One Kafka admin client, started on the first ask and kept until closed or an ask fails."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from evsched.errors import BrokerUnavailable
from evsched.settings import Settings


class KeptAdmin:
    """An admin client shared by the asks of one reader; a failed ask drops it, so the next
    ask starts afresh."""

    def __init__(self, settings: Settings, *, timeout_s: float) -> None:
        self._settings = settings
        self.timeout_s = timeout_s
        self._admin: AIOKafkaAdminClient | None = None
        self._lock = asyncio.Lock()

    @asynccontextmanager
    async def ask(self, failure: str) -> AsyncIterator[AIOKafkaAdminClient]:
        """The client, for one ask within the timeout; BrokerUnavailable (``failure``: why)
        when it cannot be started or the ask fails."""
        try:
            async with asyncio.timeout(self.timeout_s):
                yield await self._started()
        except (KafkaError, TimeoutError, OSError) as exc:
            await self.close()
            raise BrokerUnavailable(f"{failure}: {exc!r}") from exc

    async def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            await admin.close()

    async def _started(self) -> AIOKafkaAdminClient:
        async with self._lock:
            if self._admin is None:
                admin = AIOKafkaAdminClient(
                    bootstrap_servers=self._settings.bootstrap,
                    request_timeout_ms=int(self.timeout_s * 1000),
                    **dict(self._settings.kafka_options),
                )
                try:
                    await admin.start()
                except BaseException:
                    await admin.close()
                    raise
                self._admin = admin
            return self._admin
