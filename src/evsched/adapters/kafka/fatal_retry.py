"""One append through a producer, sent once more through a new one after a fatal producer error.

Both EventLogs (aiokafka's ``event_log`` and librdkafka's ``rdkafka_event_log``) keep one
producer and replace it when it is poisoned (fenced, a sequence gap, an unknown producer id). The
rule they share lives here: a fatal error on the first attempt discards that producer and tries
once more on a fresh one; any other error, or a second fatal one, leaves as PublishError.
Sending again is safe because every event carries its own ``event_id``: a duplicate from the
second attempt is dropped by the fold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog

from evsched.errors import PublishError

log = structlog.get_logger("evsched.transport")

P = TypeVar("P")  # a producer
R = TypeVar("R")  # what an acknowledged append returns


@dataclass(frozen=True, slots=True)
class FatalRetry(Generic[P]):
    """How an EventLog gets, judges and drops its producer, and words a failure."""

    current: Callable[[], Awaitable[P]]
    discard: Callable[[P], Awaitable[None]]
    errors: tuple[type[BaseException], ...]  # the client's errors; anything else passes through
    is_fatal: Callable[[P, BaseException], bool]
    why: Callable[[BaseException], str]

    async def append(self, topic: str, send: Callable[[P], Awaitable[R]]) -> R:
        """``send(producer)``'s result; PublishError naming ``topic`` when it fails."""
        for attempt in (1, 2):
            producer = await self.current()
            try:
                return await send(producer)
            except self.errors as exc:
                # A fatal error poisons this producer only.
                if attempt == 1 and self.is_fatal(producer, exc):
                    log.warning("producer_recreated", error=repr(exc), topic=topic)
                    await self.discard(producer)
                    continue
                raise PublishError(f"writing to {topic!r} failed: {self.why(exc)}") from exc
        raise AssertionError("unreachable: the second attempt returns or raises")
