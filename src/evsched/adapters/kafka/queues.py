"""Declared queues: a queue exists when its dispatch topic ``<ns>.dispatch.<queue>`` does.

Only an operator creates one (``evsched kafka topics --queue NAME``, a worker started for it,
or ``evsched dev`` for its app's queues): the API, the clients and the node only look, so
nobody but an operator can make the cluster grow a topic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from evsched.adapters.clock import monotonic_s
from evsched.adapters.kafka.access import failure_text
from evsched.adapters.kafka.topics import Topics
from evsched.errors import EvschedError
from evsched.settings import Settings


class QueueLookupError(EvschedError):
    """The cluster could not be asked which queues are declared."""


class QueueCatalog(Protocol):
    """Answers whether a queue is declared; raises QueueLookupError when it cannot tell."""

    async def declared(self, queue: str) -> bool: ...

    async def names(self) -> list[str]:
        """Every declared queue, sorted by name."""
        ...


class KafkaQueues:
    """Declared queues read from the cluster's topic list, cached.

    A queue seen once stays known; an unknown one makes a fresh listing at most every
    ``refresh_s``, so a flood of made-up names costs one metadata request per interval.
    """

    def __init__(self, settings: Settings, *, refresh_s: float = 2.0, timeout_s: float = 5.0):
        self._settings = settings
        self._topics = Topics(settings.namespace)
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._known: set[str] = set()
        self._listed_at: float | None = None
        self._lock = asyncio.Lock()

    async def declared(self, queue: str) -> bool:
        topic = _dispatch_topic(self._topics, queue)
        if topic is None:
            return False
        if topic not in self._known:
            await self._refresh(unless=topic)
        return topic in self._known

    async def names(self) -> list[str]:
        await self._refresh()
        prefix = self._topics.dispatch_prefix
        return sorted(t[len(prefix) :] for t in self._known if t.startswith(prefix))

    async def _refresh(self, *, unless: str | None = None) -> None:
        """List the topics again if the last listing is ``refresh_s`` old (or there was none),
        unless ``unless`` became known while this waited for the lock."""
        async with self._lock:
            due = self._listed_at is None or monotonic_s() - self._listed_at >= self._refresh_s
            if due and (unless is None or unless not in self._known):
                self._known = await self._list()
                self._listed_at = monotonic_s()

    async def _list(self) -> set[str]:
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self._settings.bootstrap,
            request_timeout_ms=int(self._timeout_s * 1000),
            **dict(self._settings.kafka_options),
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                await admin.start()
                return set(await admin.list_topics())
        except (KafkaError, TimeoutError) as exc:
            settings = self._settings
            why = await failure_text(settings.bootstrap, exc, **dict(settings.kafka_options))
            raise QueueLookupError(f"cannot list the declared queues: {why}") from exc
        finally:
            await admin.close()


class FixedQueues:
    """A fixed set of declared queues (tests, or a deployment that lists them itself)."""

    def __init__(self, queues: Iterable[str]) -> None:
        self._queues = frozenset(queues)

    async def declared(self, queue: str) -> bool:
        return queue in self._queues

    async def names(self) -> list[str]:
        return sorted(self._queues)


def undeclared(queue: str) -> str:
    """What to tell whoever named an undeclared queue."""
    return (
        f"queue {queue!r} is not declared: an operator creates it with "
        f"`evsched kafka topics --queue {queue}`"
    )


def _dispatch_topic(topics: Topics, queue: str) -> str | None:
    try:
        return topics.dispatch(queue)
    except ValueError:
        return None
