"""Calls from one thread to another's event loop, many per wake-up of that loop.

``loop.call_soon_threadsafe`` wakes the target loop (a write to its self-pipe) for every call, and
each wake-up lets the two threads take the GIL from each other. A worker hands every async
handler to the handler loop and every handler's end back, so under load it woke the two loops
twice per job. A ``Mailbox`` wakes its loop once for all the calls posted until that loop gets to
them: a burst of starts or ends costs one wake-up. Calls run in the order they were posted.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable


class Mailbox:
    """Runs posted calls on ``loop``, in order; ``post`` is safe from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._calls: deque[Callable[[], object]] = deque()
        self._lock = threading.Lock()
        self._woken = False  # a drain is scheduled and has not started taking calls yet

    def post(self, call: Callable[[], object]) -> None:
        """Run ``call()`` on the loop soon; dropped when the loop is closed (nothing runs there)."""
        self._calls.append(call)
        with self._lock:
            if self._woken:
                return  # the scheduled drain takes it
            self._woken = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing will run on it
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        # Cleared before taking: a call posted from here on either is taken below or schedules
        # a drain of its own (which may then find nothing).
        with self._lock:
            self._woken = False
        calls = self._calls
        while calls:
            call = calls.popleft()
            try:
                call()
            except Exception as exc:  # one failed call must not cost the others theirs
                self.loop.call_exception_handler(
                    {"message": "a call posted to a mailbox failed", "exception": exc}
                )
