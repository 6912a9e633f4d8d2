"""A task that starts after a delay: a timer until then, so stopping it early costs next to nothing.

Every attempt has a heartbeat and a follow of its job, and both have nothing to do for their
first fraction of a second, while most attempts end sooner. A task that sleeps first and is
cancelled at the attempt's end cost each attempt two tasks, two cancellations and two waits; a
timer that never fires costs a timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class LaterTask:
    """``start()`` runs as a task on the current loop after ``delay_s``, unless stopped first.

    The task runs in the context current when the LaterTask was made (trace, log bindings), as
    a task created then would.
    """

    def __init__(
        self, delay_s: float, start: Callable[[], Coroutine[Any, Any, None]], name: str
    ) -> None:
        self._start = start
        self._name = name
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._begin)

    @property
    def started(self) -> bool:
        return self._task is not None

    def _begin(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._start(), name=self._name)

    async def stop(self) -> None:
        """Cancel the timer, or the task and wait until it has ended; raises what the task
        raised, other than its cancellation (as awaiting it would)."""
        self._timer.cancel()
        task = self._task
        if task is None:
            return
        task.cancel()
        await asyncio.wait({task})
        if not task.cancelled() and (exc := task.exception()) is not None:
            raise exc
