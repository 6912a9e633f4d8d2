"""A node's assigned partitions, opened outside the group's rebalance callback (issue 9, F.19).

aiokafka sends no heartbeats while ``on_partitions_assigned`` runs: it stops its heartbeat task
before it rejoins the group and starts it again only once that callback has returned. A take-over
that opened its partitions inside the callback (indexes, the changelog's plans, producers whose
start aborts a killed owner's transactions, offset round trips) kept the heir silent for seconds,
on a loaded machine long enough to lapse its session and make the group rebalance once more. So
the callback only records the assignment and holds the new partitions' fetches; ``Openings``
opens them in a task of the node's own loop, while the consumer heartbeats.

A revoke first cancels the opens of the partitions it revokes and waits until each has undone
what it had opened (an index, a producer), then closes what is open as before: nothing of a
revoked partition is left open or deciding when the revoke returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import Any, TypeVar

from evsched.errors import PartitionRevoked
from evsched.runtime.node.health import NodeHealth
from evsched.runtime.node.lifecycle import Phase

T = TypeVar("T")

# Opens a list of partitions (``Node.open_assigned``).
Opens = Callable[[list[int]], Coroutine[Any, Any, None]]
# Marks a partition FAILED, to be reopened later (``PartitionOpener.failed``).
Failed = Callable[[int, Exception], None]

# The phases of a partition whose open had not ended when its task did.
UNOPENED = frozenset({Phase.ASSIGNED, Phase.OPENING})


class Openings:
    """The opens under way: one task per assignment, which opens its partitions side by side."""

    def __init__(self, health: NodeHealth, failed: Failed, logger: Any) -> None:
        self.health = health
        self.failed = failed
        self.log = logger
        self._tasks: dict[asyncio.Task[None], frozenset[int]] = {}

    def start(self, partitions: Collection[int], opens: Opens) -> None:
        """Open ``partitions`` in the background; returns at once (no await)."""
        wanted = sorted(partitions)
        if not wanted:
            return
        task = asyncio.get_running_loop().create_task(
            opens(wanted), name=f"evsched-open-{'-'.join(map(str, wanted))}"
        )
        self._tasks[task] = frozenset(wanted)
        task.add_done_callback(self._ended)

    def opening(self) -> frozenset[int]:
        """The partitions of every open under way."""
        return frozenset[int]().union(*self._tasks.values())

    async def cancel(self, partitions: Collection[int]) -> None:
        """Cancel the opens that hold any of ``partitions``; return once each has ended.

        An open cancelled with others of its partitions not revoked (not expected: the group's
        revoke names every partition it assigned) leaves those to be reopened soon.
        """
        revoked = frozenset(partitions)
        hit = {task: held for task, held in self._tasks.items() if held & revoked}
        for task in hit:
            task.cancel()
        if hit:
            # Not shielded: each open undoes what it opened itself, even if this wait is cut.
            await asyncio.wait(list(hit))
        spared = frozenset[int]().union(*hit.values()) - revoked
        self._unopened(spared, PartitionRevoked("its open was cancelled with another's revoke"))

    async def wait(self) -> None:
        """Until every open under way has ended."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def _ended(self, task: asyncio.Task[None]) -> None:
        held = self._tasks.pop(task, frozenset())
        if task.cancelled() or (exc := task.exception()) is None:
            return
        # Each partition's own failure was handled where it happened: this is a bug, or a
        # standby copy that would not let go. Its partitions are reopened later, loudly.
        self.log.error("partition_opens_failed", partitions=sorted(held), error=repr(exc))
        if isinstance(exc, Exception):
            self._unopened(held, exc)

    def _unopened(self, partitions: Collection[int], exc: Exception) -> None:
        for partition in sorted(partitions):
            phase = self.health.phase(partition)
            if phase not in UNOPENED:
                continue  # open, restoring, failed already, or revoked meanwhile
            if phase is Phase.ASSIGNED:
                self.health.move(partition, Phase.OPENING)
            self.failed(partition, exc)


async def opened_side_by_side(
    opens: Sequence[Coroutine[Any, Any, T | None]], undo: Callable[[T], Awaitable[object]]
) -> list[T]:
    """What each of ``opens`` opened (None: nothing), run side by side.

    If the caller is cancelled meanwhile (a revoke), what the opens that had already finished
    opened is given to ``undo`` before the cancellation goes on: ``gather`` would drop it.
    """
    tasks = [asyncio.ensure_future(opening) for opening in opens]
    try:
        found = await asyncio.gather(*tasks)
    except BaseException:
        if pending := [task for task in tasks if not task.done()]:
            await asyncio.wait(pending)
        made = [t.result() for t in tasks if not t.cancelled() and t.exception() is None]
        await asyncio.gather(*(undo(thing) for thing in made if thing is not None))
        raise
    return [thing for thing in found if thing is not None]
