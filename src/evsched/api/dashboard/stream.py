"""The live view's fan-out: one snapshot per tick, built once and handed to every open stream.

Each ``/live`` stream used to build its own snapshot on every commit, so 300 open dashboards
cost 300 snapshots a tick and starved the write routes (issue 32: ``POST /v1/jobs`` went from
0.02-0.12 s to 2.2-2.8 s). Now one task per API builds the frame (the JSON, serialised once) and
offers it to every subscriber. A subscriber keeps only the latest frame: each one is the whole
overview, so a newer one replaces an unsent older one and a slow reader costs one frame, never
a backlog. How many streams may be open at once is capped, with a smaller share for callers who
proved no token, and past a cap a stream is refused with a 503 and ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import structlog
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from evsched.api.dashboard.live import Live
from evsched.api.errors import ApiError

log = structlog.get_logger("evsched.api")
MIN_INTERVAL_S = 0.5  # at most two snapshots a second, however fast batches commit
RETRY_AFTER_S = 10  # a refused stream's Retry-After; the page retries a closed stream as late


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamCaps:
    """How many ``/live`` streams may be open at once: ``total``, of which ``anonymous`` may be
    streams of callers who proved no token (all of them when the API runs without auth)."""

    total: int = 200
    anonymous: int = 50

    def __post_init__(self) -> None:
        if not 0 <= self.anonymous <= self.total:
            raise ValueError("live stream caps need 0 <= anonymous <= total")


class Subscriber:
    """One stream's mailbox: the latest frame not yet taken, and whether the feed ended."""

    __slots__ = ("_frame", "_ready", "anonymous", "ended")

    def __init__(self, *, anonymous: bool) -> None:
        self.anonymous = anonymous
        self.ended = False
        self._frame: str | None = None
        self._ready = asyncio.Event()

    def offer(self, frame: str) -> None:
        self._frame = frame  # replaces an unsent one: the newer snapshot says all it said
        self._ready.set()

    def end(self) -> None:
        self.ended = True
        self._ready.set()

    async def next(self, timeout_s: float) -> str | None:
        """The latest frame; None after ``timeout_s`` without one or once the feed ended."""
        if self._frame is None and not self.ended:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout_s)
        self._ready.clear()
        frame, self._frame = self._frame, None
        return None if self.ended else frame


class Fanout:
    """Builds a frame each time ``live`` changes (at most one per ``min_interval_s``) while
    anyone listens, and offers it to every subscriber; ``builds`` counts the frames built."""

    def __init__(
        self,
        live: Live,
        build: Callable[[], Awaitable[str]],
        *,
        caps: StreamCaps,
        min_interval_s: float,
    ) -> None:
        self._live = live
        self._build = build
        self.caps = caps
        self._min_interval_s = min_interval_s
        self._subscribers: set[Subscriber] = set()
        self._latest: tuple[int, str] | None = None  # (version, frame) last built
        self._task: asyncio.Task[None] | None = None
        self.builds = 0

    @property
    def open(self) -> int:
        return len(self._subscribers)

    @property
    def anonymous(self) -> int:
        return sum(1 for s in self._subscribers if s.anonymous)

    def join(self, *, anonymous: bool) -> Subscriber:
        """A new stream's mailbox, offered the latest frame at once; ApiError 503 past a cap."""
        if self.open >= self.caps.total:
            raise _full(f"{self.caps.total} live streams are open, the most this API serves")
        if anonymous and self.anonymous >= self.caps.anonymous:
            raise _full(
                f"{self.caps.anonymous} live streams without a token are open, the most this "
                "API serves: log in (or send a read token) for one of the rest"
            )
        subscriber = Subscriber(anonymous=anonymous)
        self._subscribers.add(subscriber)
        if self._live.closed:
            subscriber.end()
        elif self._latest is not None and self._latest[0] == self._live.version:
            subscriber.offer(self._latest[1])
        if self._task is None and not self._live.closed:
            self._task = asyncio.create_task(self._run(), name="evsched-live-fanout")
        return subscriber

    def leave(self, subscriber: Subscriber) -> None:
        self._subscribers.discard(subscriber)

    async def _run(self) -> None:
        seen = -1 if self._latest is None else self._latest[0]
        try:
            while self._subscribers:
                version = await self._live.changed(seen, timeout_s=60.0)
                if version is None:
                    break
                if version == seen or not self._subscribers:
                    continue
                seen = version
                frame = await self._build()
                self.builds += 1
                self._latest = (version, frame)
                for subscriber in self._subscribers:
                    subscriber.offer(frame)
                await self._live.pause(self._min_interval_s)
        except Exception:
            # The streams end and the browsers reconnect: one bad snapshot must not hang them.
            log.exception("live_snapshot_failed", streams=self.open)
            self._latest = None
        finally:
            self._task = None
        if self._live.closed or self._latest is None:
            for subscriber in self._subscribers:
                subscriber.end()


class LiveResponse(StreamingResponse):
    """A stream that gives its subscriber's place back however it ends, even when the client
    left before the body began (a generator that never started runs no ``finally``)."""

    def __init__(
        self, content: AsyncIterator[str], *, feed: Fanout, subscriber: Subscriber
    ) -> None:
        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self._feed = feed
        self._subscriber = subscriber

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._feed.leave(self._subscriber)


def _full(message: str) -> ApiError:
    return ApiError(503, "too_many_streams", message, headers={"Retry-After": str(RETRY_AFTER_S)})
