"""The ack bound of ``replicas.acknowledged`` for many appends at once, on one timer.

``acknowledged`` gives each append its own waiter, timer and coroutines: on librdkafka, whose
produce costs a few microseconds, that bookkeeping was half of an append's CPU on the event loop.
``AckWatch`` keeps the appends' ack futures in one heap by when each is next due to be looked at,
and one timer serves them all: an append awaits its ack future alone. An ack that takes longer
than ``check_after_s`` has its partition looked at (one look at a time, each serving every ack
overdue by then, its describe shared through ``ReplicaCheck``), and its future fails with
NotEnoughReplicas when the partition cannot take writes; one not acknowledged within
``timeout_s`` fails with PublishError. The messages are ``replicas.acknowledged``'s. The record
itself stays with the producer either way.

An ack that falls due while a look is running waits for the next look, which starts as soon as
the running one ends: pushing it back a whole ``check_after_s`` instead let a busy watch (a look
running most of the time, at 20 appends a second) put some acks off again and again, 20 s and more.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from evsched.adapters.kafka.replicas import (
    CHECK_AFTER_S,
    DESCRIBE_TIMEOUT_S,
    not_acknowledged,
    refused,
)

# How late a look or a timeout may come: the timer fires at most this often, however many acks.
TICK_S = 0.05

# The look at one topic: the problem of each of its keys' partitions (None: none, or unknown).
Problems = Callable[[str, list[str]], Awaitable[list[str | None]]]


class AckWatch:
    """Bounds the ack futures of one producer's appends; bound to the running loop."""

    def __init__(
        self,
        problems: Problems,
        *,
        timeout_s: float,
        check_after_s: float = CHECK_AFTER_S,
        on_refused: Callable[[asyncio.Future[Any]], None] = lambda _: None,
    ) -> None:
        self._problems = problems
        self._timeout_s = timeout_s
        self._check_after_s = check_after_s
        self._on_refused = on_refused  # a refused ack whose record the producer still holds
        # (next look at, tie-break, deadline, ack, topic, key): the earliest first.
        self._heap: list[tuple[float, int, float, asyncio.Future[Any], str, str]] = []
        self._order = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._looking: asyncio.Task[None] | None = None
        # Acks due for a look, with their topic and key: the next look takes them all.
        self._due: dict[asyncio.Future[Any], tuple[str, str]] = {}

    def watch(self, ack: asyncio.Future[Any], topic: str, key: str) -> None:
        """Bound ``ack``: it fails (NotEnoughReplicas, PublishError) unless it settles in time."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self._timeout_s
        entry = (min(now + self._check_after_s, deadline), next(self._order), deadline)
        heapq.heappush(self._heap, (*entry, ack, topic, key))
        if self._timer is None:
            self._timer = loop.call_at(self._heap[0][0], self._tick)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._looking is not None:
            self._looking.cancel()
        self._heap.clear()
        self._due.clear()

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._heap and self._heap[0][0] <= now:
            _, _, deadline, ack, topic, key = heapq.heappop(self._heap)
            if ack.done():
                continue
            if deadline <= now:
                self._due.pop(ack, None)
                ack.set_exception(not_acknowledged(f"writing to {topic!r}", self._timeout_s))
                continue
            self._due[ack] = (topic, key)
            entry = (min(now + self._check_after_s, deadline), next(self._order), deadline)
            heapq.heappush(self._heap, (*entry, ack, topic, key))
        if self._due and (self._looking is None or self._looking.done()):
            self._looking = loop.create_task(self._look_while_due())
        self._timer = None
        if self._heap:
            self._timer = loop.call_at(max(self._heap[0][0], now + TICK_S), self._tick)

    async def _look_while_due(self) -> None:
        """Looks until no ack is due: those that fell due during a look go in the next one."""
        while self._due:
            due, self._due = self._due, {}
            await self._look([(ack, topic, key) for ack, (topic, key) in due.items()])

    async def _look(self, overdue: list[tuple[asyncio.Future[Any], str, str]]) -> None:
        by_topic: dict[str, list[tuple[asyncio.Future[Any], str]]] = {}
        for ack, topic, key in overdue:
            if not ack.done():
                by_topic.setdefault(topic, []).append((ack, key))
        for topic, acks in by_topic.items():
            # A look that fails or hangs names no cause; the deadline still holds.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(DESCRIBE_TIMEOUT_S):
                    causes = await self._problems(topic, [key for _, key in acks])
                for (ack, _), cause in zip(acks, causes, strict=True):
                    if cause is not None and not ack.done():
                        ack.set_exception(refused(f"writing to {topic!r}", cause))
                        self._on_refused(ack)
