"""Fresh engines for integration tests: a node and a worker, or a scenario run and replayed."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from tests.conftest import unique_name
from tests.integration.engine import Stack

from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.events import Event, Position
from evsched.core.invariants import Replay, replay


@asynccontextmanager
async def node_and_worker(
    bootstrap: str, prefix: str, tmp_path: Path, *, check: bool = False
) -> AsyncIterator[Stack]:
    """A 3-partition namespace with queue ``default``, a node and a worker; with ``check``, the
    stack's invariants are checked once the test is done (jobs may still be live)."""
    namespace = unique_name(prefix)
    await ensure_topics(bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(bootstrap, namespace, tmp_path)
    engine.start_node("node-1", "--dispatch-timeout-s", "10")
    engine.start_worker("worker-1", "--lease-s", "3")
    try:
        yield engine
        if check:
            await engine.check(all_terminal=False)
    finally:
        await engine.close()


History = list[tuple[Event, Position]]


async def judged_run(
    bootstrap: str, prefix: str, tmp_path: Path, scenario: Callable[[Stack], Awaitable[object]]
) -> tuple[History, Replay]:
    """``scenario`` run once on a fresh 3-partition namespace (its own processes), every job
    ended and no invariant broken; the history read back and the fold's replay of it."""
    namespace = f"{prefix}{os.urandom(4).hex()}"
    await ensure_topics(bootstrap, namespace, event_partitions=3, queues=["default"])
    stack = Stack(bootstrap, namespace, tmp_path)
    try:
        await scenario(stack)
        done = await stack.check(all_terminal=True)
        events, _ = await stack.history()
    finally:
        await stack.close()
    assert not done.violations
    return events, replay(events)
