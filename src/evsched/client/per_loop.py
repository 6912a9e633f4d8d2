"""One client per event loop, started on first use: Kafka clients must stay on their loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from evsched.errors import EvschedError


class Startable(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


C = TypeVar("C", bound=Startable)


class PerLoop(Generic[C]):
    """The client ``factory`` makes, started on first use by the running loop.

    Used from another loop while the first still exists, it raises; once that loop is closed
    (e.g. a second ``asyncio.run``), its client went with it and a new one is made. A client
    whose start fails (or whose caller is cancelled meanwhile) is closed, and the next call
    makes a new one.
    """

    def __init__(self, factory: Callable[[], C]) -> None:
        self._factory = factory
        self._client: C | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> C:
        loop = asyncio.get_running_loop()
        if self._loop is loop and (ready := self._client) is not None:
            return ready  # every call after the first: the lock only orders the start
        if self._loop is not None and self._loop is not loop:
            if not self._loop.is_closed():
                raise EvschedError(
                    "this App's Kafka clients belong to another running event loop: use one "
                    "loop per App, or the *_sync methods from other threads"
                )
            self._client, self._loop, self._lock = None, None, asyncio.Lock()
        async with self._lock:
            if self._client is None:
                client = self._factory()
                try:
                    await client.start()
                except BaseException:
                    with contextlib.suppress(Exception):
                        await client.close()
                    raise
                self._client, self._loop = client, loop
            return self._client

    async def close(self) -> None:
        client, self._client, self._loop = self._client, None, None
        if client is not None:
            await client.close()
