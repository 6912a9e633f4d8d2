"""A private event loop on a daemon thread, so plain sync code can call the async client."""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """Runs coroutines on its own loop; safe to call from any thread except its own."""

    def __init__(
        self, name: str, *, cleanup: Callable[[], Coroutine[Any, Any, None]] | None = None
    ) -> None:
        self._name = name
        self._cleanup = cleanup
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``make()`` on the private loop and block until it returns (or raises)."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a sync client call on the client's own loop thread would deadlock")
        loop = self._started()
        return asyncio.run_coroutine_threadsafe(make(), loop).result()

    def close(self) -> None:
        """Run the cleanup on the loop, then stop the thread; a later ``run`` starts a new one."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        atexit.unregister(self.close)
        try:
            if self._cleanup is not None:
                asyncio.run_coroutine_threadsafe(self._cleanup(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name=self._name, daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                # A sync program rarely closes its client; stop the loop cleanly at exit anyway.
                atexit.register(self.close)
            return self._loop
