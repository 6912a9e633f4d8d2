"""Blocking calls made where they do not hold the event loop: on a thread, or in turns.

The runtime's loops (a node's heartbeats, fetches and partition steps; an API's replica) share
one event loop; a call that blocks for long holds all of them. Code that makes such calls takes
an ``Offload`` and leaves the choice to its caller: a node runs them on its own threads, in order
per partition (``runtime.projection.index_threads``); a caller without threads runs them
``in_turn``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Offload(Protocol):
    """Runs a blocking call where it does not hold the event loop (a thread, or in turns)."""

    def __call__(self, call: Callable[[], T], /) -> Awaitable[T]: ...


async def in_turn(call: Callable[[], T]) -> T:
    """Run ``call`` on the event loop, then let the loop run (callers without threads)."""
    result = call()
    await asyncio.sleep(0)
    return result


async def outlive(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done, through any further cancellation of the caller."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([future])


async def made(offload: Offload, call: Callable[[], T], undo: Callable[[T], object]) -> T:
    """``await offload(call)``; if the caller is cancelled meanwhile, ``undo`` what it made.

    A thread cannot be stopped: the call goes on, and what it returns (an index opened for no
    one, which would hold its lock) is given to ``undo``, through ``offload`` as well, before
    the cancellation goes on.
    """
    task = asyncio.ensure_future(offload(call))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await outlive(task)
        if not task.cancelled() and task.exception() is None:
            result = task.result()
            with contextlib.suppress(Exception):
                await offload(lambda: undo(result))
        raise
