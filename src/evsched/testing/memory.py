"""In-memory twins of the event log, dispatch feed and job reader; a frozen clock."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from evsched.adapters.avro import decode_event, encode_dispatch
from evsched.adapters.signing import DispatchKey
from evsched.core.dispatch import Dispatch
from evsched.core.events import Event
from evsched.core.state import JobState
from evsched.errors import BrokerUnavailable, PublishError
from evsched.ports import Appended, Clock, Outbound, Record


class FrozenClock:
    """A clock that moves only when told to: ``advance(seconds)`` or by setting ``wall_ms``."""

    def __init__(self, wall_ms: int = 1_700_000_000_000, mono_s: float = 1_000.0) -> None:
        self.wall_ms = wall_ms
        self.mono_s = mono_s

    def now_ms(self) -> int:
        return self.wall_ms

    def monotonic_s(self) -> float:
        return self.mono_s

    def advance(self, seconds: float) -> None:
        self.wall_ms += round(seconds * 1000)
        self.mono_s += seconds


@dataclass(frozen=True, slots=True)
class Written:
    """One record the MemoryLog acknowledged."""

    topic: str
    key: str
    value: bytes
    offset: int
    log_at: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def event(self) -> Event:
        return decode_event(self.value)


class _Waiters:
    """Wakes coroutines (on any loop or thread) waiting for a predicate to become true."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    def notify(self) -> None:
        with self._lock:
            waiting = list(self._waiting)
        for loop, event in waiting:
            if not loop.is_closed():
                loop.call_soon_threadsafe(event.set)

    async def wait(self, holds: Callable[[], bool], timeout_s: float, what: str) -> None:
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiting.append(entry)
        try:
            async with asyncio.timeout(timeout_s):
                while not holds():
                    await entry[1].wait()
                    entry[1].clear()
        except TimeoutError:
            raise AssertionError(f"not within {timeout_s} s: {what}") from None
        finally:
            with self._lock:
                self._waiting.remove(entry)


class MemoryLog:
    """The EventLog twin: keeps what it acknowledges; ``fail_next`` makes an append fail."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._records: list[Written] = []
        self._failures: deque[BaseException] = deque()
        self._waiters = _Waiters()
        self.started = 0
        self.closed = 0
        # The LogAppendTime acknowledgements report when set; else, given a clock, its time at
        # the append (like evsched's events topic); else None (like a topic with CreateTime).
        self.log_at: int | None = None

    async def start(self) -> None:
        self.started += 1

    async def close(self) -> None:
        self.closed += 1

    async def append(
        self, topic: str, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Appended:
        await asyncio.sleep(0)  # like a real ack, let other tasks run meanwhile
        with self._lock:
            if self._failures:
                raise self._failures.popleft()
            offset = sum(1 for r in self._records if r.topic == topic)
            log_at = self.log_at
            if log_at is None and self._clock is not None:
                log_at = self._clock.now_ms()
            self._records.append(Written(topic, key, value, offset, log_at, tuple(headers)))
        self._waiters.notify()
        return Appended(topic, 0, offset, log_at)

    async def append_many(
        self, topic: str, records: Sequence[Outbound]
    ) -> list[Appended | PublishError]:
        results: list[Appended | PublishError] = []
        for record in records:
            try:
                results.append(await self.append(topic, record.key, record.value))
            except PublishError as exc:
                results.append(exc)
        return results

    async def append_atomic(self, topic: str, records: Sequence[Outbound]) -> list[Appended]:
        """All or none: a failure injected with ``fail_next`` fails the whole batch."""
        await asyncio.sleep(0)
        with self._lock:
            if self._failures:
                raise self._failures.popleft()
        return [await self.append(topic, r.key, r.value) for r in records]

    async def partition_count(self, topic: str) -> int:
        return 1  # every record lands on partition 0

    def fail_next(self, error: BaseException | None = None, times: int = 1) -> None:
        """The next ``times`` appends raise ``error`` (a PublishError by default)."""
        with self._lock:
            for _ in range(times):
                self._failures.append(error or PublishError("injected failure"))

    @property
    def records(self) -> list[Written]:
        with self._lock:
            return list(self._records)

    def events(self, *kinds: type[Event]) -> list[Event]:
        """Every event written so far, decoded; only those of ``kinds`` when given."""
        decoded = [record.event for record in self.records]
        return [e for e in decoded if not kinds or isinstance(e, kinds)]

    async def wait_for(
        self, holds: Callable[[MemoryLog], bool], *, timeout_s: float = 5.0, what: str = ""
    ) -> None:
        """Return once ``holds(log)`` is true; AssertionError after ``timeout_s``."""
        await self._waiters.wait(lambda: holds(self), timeout_s, what or "log condition")


class MemoryFeed:
    """The DispatchFeed twin: ``put`` records in, the worker ``take``s and commits them at once."""

    def __init__(self, topic: str = "evsched.dispatch.default") -> None:
        self.topic = topic
        self._queue: deque[Record] = deque()
        self._offsets = itertools.count()
        self._arrived = asyncio.Event()
        self.committed: list[Record] = []
        self.requests: list[int] = []
        self.started = 0
        self.closed = 0
        self._waiters = _Waiters()

    async def start(self) -> None:
        self.started += 1

    async def close(self) -> None:
        self.closed += 1
        self._waiters.notify()

    async def wait_for(
        self, holds: Callable[[MemoryFeed], bool], *, timeout_s: float = 5.0, what: str = ""
    ) -> None:
        """Return once ``holds(feed)`` is true (checked as records are taken or the feed closes)."""
        await self._waiters.wait(lambda: holds(self), timeout_s, what or "feed condition")

    def put(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> Record:
        record = Record(self.topic, 0, next(self._offsets), 0, key, value, headers)
        self._queue.append(record)
        self._arrived.set()
        return record

    def put_dispatch(self, dispatch: Dispatch, signed_by: DispatchKey | None = None) -> Record:
        """Put ``dispatch`` as a node would, signed when ``signed_by`` is given."""
        value = encode_dispatch(dispatch)
        headers = () if signed_by is None else (signed_by.header(self.topic, value),)
        return self.put(value, key=dispatch.job_id.encode(), headers=headers)

    def put_all(self, dispatches: Iterable[Dispatch]) -> None:
        for dispatch in dispatches:
            self.put_dispatch(dispatch)

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def take(self, max_records: int, timeout_s: float) -> list[Record]:
        if self.closed:
            raise AssertionError("take() on a closed feed")
        self.requests.append(max_records)
        self._waiters.notify()
        if max_records <= 0:
            return []
        if not self._queue:
            self._arrived.clear()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._arrived.wait()
            except TimeoutError:
                return []
        taken = [self._queue.popleft() for _ in range(min(max_records, len(self._queue)))]
        self.committed.extend(taken)
        self._waiters.notify()
        return taken


@dataclass
class MemoryReader:
    """The JobReader twin: a dict of job states the test fills in."""

    jobs: dict[str, JobState] = field(default_factory=dict)

    async def job(self, job_id: str) -> JobState | None:
        return self.jobs.get(job_id)


class MemoryPools:
    """The twin of ``ports.WorkerPools``: ``serve(pool, *queues)`` joins a member, ``leave(pool)``
    empties the pool, ``rebalancing(pool)`` hides its members until it is served again, and
    ``failing`` makes every ask fail as an unreachable or unauthorized broker does."""

    def __init__(self) -> None:
        self._pools: dict[str, dict[str, int] | None] = {}
        self.failing = False
        self.asks = 0

    def serve(self, pool: str, *queues: str) -> None:
        served = dict(self._pools.get(pool) or {})
        for queue in queues:
            served[queue] = served.get(queue, 0) + 1
        self._pools[pool] = served

    def leave(self, pool: str) -> None:
        self._pools.pop(pool, None)

    def rebalancing(self, pool: str) -> None:
        self._pools[pool] = None

    async def pools(self) -> Mapping[str, Mapping[str, int] | None]:
        self.asks += 1
        if self.failing:
            raise BrokerUnavailable("cannot describe the worker groups: not authorized")
        return {pool: None if q is None else dict(q) for pool, q in self._pools.items()}

    async def close(self) -> None:
        pass
