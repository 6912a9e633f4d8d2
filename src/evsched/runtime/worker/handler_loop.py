"""The event loop async handlers run on, in a thread of its own, watched for blocking calls.

The worker's own loop (heartbeats, the dispatch consumer, the event producer) never runs user
code, so an async handler that blocks (``time.sleep``, a synchronous client) cannot stop the
renewals of other attempts; it can only slow the other async handlers, and the watchdog names it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from evsched.adapters.clock import monotonic_s
from evsched.runtime.worker.handoff import Mailbox

log = structlog.get_logger("evsched.worker")

BLOCKED_AFTER_S = 1.0
TICK_S = 0.05


class HandlerEscaped(Exception):
    """A handler ended with a BaseException that is not an Exception (SystemExit, ...)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(repr(original))
        self.original = original


def contain(call: Callable[[], Any]) -> Any:
    """Run a sync handler; SystemExit, KeyboardInterrupt and the like come out as HandlerEscaped."""
    try:
        return call()
    except Exception:
        raise
    except BaseException as exc:
        raise HandlerEscaped(exc) from exc


class ThreadCount:
    """How many sync handlers are running in threads right now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.busy = 0

    def run(self, context: contextvars.Context, call: Callable[[], Any]) -> Any:
        with self._lock:
            self.busy += 1
        try:
            return context.run(contain, call)
        finally:
            with self._lock:
                self.busy -= 1


async def _contained(call: Callable[[], Awaitable[Any]]) -> Any:
    # Caught inside the task: asyncio re-raises SystemExit and KeyboardInterrupt out of the loop.
    # GeneratorExit passes: it is how an abandoned handler's coroutine is closed.
    try:
        return await call()
    except (Exception, asyncio.CancelledError, GeneratorExit):
        raise
    except BaseException as exc:
        raise HandlerEscaped(exc) from exc


@dataclass(slots=True)
class HandlerRun:
    """One async handler on the handler loop: ``done`` (a future of the loop that submitted it)
    resolves only once the handler has ended."""

    done: asyncio.Future[Any]
    _inbox: Mailbox
    _task: asyncio.Task[Any] | None = None

    def cancel(self) -> None:
        """Ask the handler to stop; it may ignore it (then ``done`` stays pending)."""
        self._inbox.post(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


class HandlerLoop:
    """Start with ``start()``; ``watch()`` runs on the worker's loop; ``close()`` when done."""

    def __init__(self, blocked_after_s: float = BLOCKED_AFTER_S) -> None:
        self.blocked_after_s = blocked_after_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(
            target=self._run, name="evsched-async-handlers", daemon=True
        )
        self._ticked_at = monotonic_s()
        self.abandoned = 0  # handlers that ignored cancellation at close()
        # Starts and cancels go to the handler loop, and ends back to the submitting loop,
        # through mailboxes: one wake-up of the other thread per burst, not per handler.
        self._inbox: Mailbox | None = None
        self._outbox: Mailbox | None = None

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._inbox = Mailbox(self._loop)
        self._ticked_at = monotonic_s()
        self._thread.start()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the handler loop has not been started")
        return self._loop

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick)
        self.loop.run_forever()

    def _tick(self) -> None:
        self._ticked_at = monotonic_s()
        self.loop.call_later(TICK_S, self._tick)

    def submit(self, call: Callable[[], Awaitable[Any]], name: str) -> HandlerRun:
        """Run ``call()`` on the handler loop in the caller's context (trace, log bindings).

        Called on the worker's loop; the run's ``done`` is a future of that loop.
        """
        if self._inbox is None:
            raise RuntimeError("the handler loop has not been started")
        outbox = self._outbox_to(asyncio.get_running_loop())
        done: asyncio.Future[Any] = outbox.loop.create_future()
        run = HandlerRun(done, self._inbox)
        context = contextvars.copy_context()

        def begin() -> None:
            task = self.loop.create_task(_contained(call), name=name, context=context)
            run._task = task
            task.add_done_callback(lambda t: outbox.post(functools.partial(_settle, done, t)))

        self._inbox.post(begin)
        return run

    def _outbox_to(self, loop: asyncio.AbstractEventLoop) -> Mailbox:
        if self._outbox is None or self._outbox.loop is not loop:
            self._outbox = Mailbox(loop)
        return self._outbox

    async def watch(self) -> None:
        """Log once per episode when user code holds the handler loop, naming the task and line."""
        blocked_since: float | None = None
        while True:
            await asyncio.sleep(TICK_S)
            stalled = monotonic_s() - self._ticked_at
            if stalled < self.blocked_after_s:
                if blocked_since is not None:
                    log.info("handler_loop_unblocked", blocked_s=round(stalled, 3))
                blocked_since = None
                continue
            if blocked_since is None:
                blocked_since = self._ticked_at
                log.warning("handler_loop_blocked", blocked_s=round(stalled, 3), **self._culprit())

    def _culprit(self) -> dict[str, str]:
        """The task on the loop, its handler's frame and the innermost frame of the thread."""
        task = asyncio.current_task(self.loop)
        frame = sys._current_frames().get(self._thread.ident or -1)
        stack = traceback.extract_stack(frame) if frame is not None else []
        entry = [i for i, f in enumerate(stack) if f.name == _contained.__name__]
        handler = stack[entry[-1] + 1] if entry and entry[-1] + 1 < len(stack) else None
        return {
            "task": task.get_name() if task is not None else "",
            "handler_at": _at(handler),
            "at": _at(stack[-1] if stack else None),
        }

    async def close(self, timeout_s: float) -> None:
        """Cancel what still runs, wait up to ``timeout_s``, then stop the loop.

        A handler that ignores cancellation is left behind on the (daemon) thread and logged:
        shutdown stays bounded.
        """
        if not self._thread.is_alive():
            return
        stopping = asyncio.run_coroutine_threadsafe(_cancel_all(timeout_s), self.loop)
        try:
            left = await asyncio.wait_for(asyncio.wrap_future(stopping), timeout_s + 1)
        except TimeoutError:  # the loop itself is blocked by a handler
            left = ["<the handler loop is blocked>"]
        if left:
            log.warning("handlers_ignored_cancellation", tasks=left)
        self.abandoned = len(left)
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join, 1.0)
        if not self._thread.is_alive():
            self.loop.close()  # what is left on it never runs again


async def _cancel_all(timeout_s: float) -> list[str]:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s)
    return sorted(t.get_name() for t in tasks if not t.done())


def _at(frame: traceback.FrameSummary | None) -> str:
    return "" if frame is None else f"{frame.filename}:{frame.lineno} in {frame.name}"


def _settle(done: asyncio.Future[Any], task: asyncio.Task[Any]) -> None:
    """On the submitting loop: ``done`` as the handler's task ended (it has, on its own loop)."""
    if done.done():  # cancelled by its attempt, which no longer waits for it
        return
    if task.cancelled():
        done.set_exception(HandlerEscaped(asyncio.CancelledError()))
    elif (exc := task.exception()) is not None:
        done.set_exception(exc if isinstance(exc, Exception) else HandlerEscaped(exc))
    else:
        done.set_result(task.result())
