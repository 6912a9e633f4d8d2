"""The one thread that makes every call of a librdkafka group member (``rdkafka_group``).

confluent-kafka (from 2.16) lets one caller at a time into a consumer: a call from another thread
waits until the call in progress returns, a re-entrant call from a rebalance callback passes. A
fetch waiting in ``poll`` therefore held every pause, seek and position of the event loop; and a
rebalance callback, which waits inside ``poll`` for the event loop, never ended while the loop
waited to enter: the node stalled mid-rebalance and ignored SIGTERM. So one thread makes every
call: blocking ones (fetch, subscribe, close) one after another; pauses, resumes and seeks, which
the event loop must not wait for, are queued and made before the next poll, between a fetch's
short polls, and when a rebalance callback has ended.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# The longest one poll waits: queued pauses, resumes and seeks wait at most this long.
POLL_SLICE_S = 0.01


class ConsumerThread:
    """Runs calls on a thread of its own, in order; ``later`` queues calls nobody waits for."""

    def __init__(self, name: str) -> None:
        self._calls: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        self._calls = collections.deque()
        self._later: collections.deque[Callable[[], None]] = collections.deque()
        self._ready = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the thread, after the calls before it; raises what it raised."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._ready:
            if self._stopping:
                raise RuntimeError("consumer thread stopped")
            self._calls.append((fn, future))
            self._ready.notify()
        return await asyncio.wrap_future(future)

    def later(self, fn: Callable[[], None]) -> None:
        """Queue ``fn`` (a pause, resume or seek); made before the thread's next poll."""
        with self._ready:
            self._later.append(fn)
            self._ready.notify()

    def pending(self) -> bool:
        return bool(self._later)

    def run_later(self) -> None:
        """On the thread: make the queued calls now. Nobody waits for them: one that fails (its
        partition revoked meanwhile, the consumer closed) is skipped."""
        assert threading.current_thread() is self._thread, "run_later off the consumer thread"
        while True:
            try:
                fn = self._later.popleft()
            except IndexError:
                return
            with contextlib.suppress(Exception):
                fn()

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        """End the thread once the calls queued before have run; does not wait for it."""
        with self._ready:
            self._stopping = True
            self._ready.notify()

    def join(self, timeout_s: float) -> bool:
        """Wait for the thread to end (from a thread other than the event loop's); True if so."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._calls and not self._later and not self._stopping:
                    self._ready.wait()
                call = self._calls.popleft() if self._calls else None
                if call is None and not self._later and self._stopping:
                    return
            self.run_later()
            if call is None:
                continue
            fn, future = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, who awaits it
                future.set_exception(exc)
