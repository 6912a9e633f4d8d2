"""A whole evsched stack under a steady load on the three-broker cluster, for broker-fault tests.

``loaded_stack`` starts a node and a worker process on a fresh namespace (RF 3, min ISR 2) and a
load generator that enqueues the scenario app's ``s.effect`` jobs through the client library at
``RATE_PER_S``, open loop (a slow enqueue never delays the next). Every enqueue is recorded as
acknowledged (with its latency) or failed (with its error and how long it took to fail).
``Loaded.finish`` stops the load, waits until every acknowledged job succeeded, and runs the
invariant checks over the whole log: no acknowledged enqueue lost, no success accepted twice, no
duplicate or stale effect, effects == accepted successes read back with a read_committed consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.errors import UnknownTopicOrPartitionError
from tests.conftest import unique_name
from tests.integration.engine import Stack, all_succeeded, wait_for

from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import Task
from evsched.core.events import JobLeased
from evsched.core.invariants import Replay
from evsched.core.state import TERMINAL_STATUSES, Status
from evsched.errors import EvschedError

RATE_PER_S = 20.0
PARTITIONS = 3


@dataclass
class Load:
    """What the load generator saw: acknowledged jobs and failed enqueues."""

    acked: dict[str, float] = field(default_factory=dict)  # job id -> seconds to the ack
    # (wall-clock ms at the call, error type, message, seconds until it failed)
    failed: list[tuple[float, str, str, float]] = field(default_factory=list)
    # Errors that are not evsched's (a client bug: a raw Kafka error, a traceback)
    unexpected: list[str] = field(default_factory=list)

    async def one(self, task: Task, tag: str) -> None:
        called_ms, start = time.time() * 1000, time.monotonic()
        try:
            job = await task.enqueue(tag)
        except EvschedError as exc:
            took = time.monotonic() - start
            self.failed.append((called_ms, type(exc).__name__, str(exc), took))
        except Exception as exc:
            self.unexpected.append(repr(exc))
        else:
            self.acked[str(job)] = time.monotonic() - start

    async def run(self, stack: Stack, stop: asyncio.Event, rate: float = RATE_PER_S) -> None:
        running: set[asyncio.Task[None]] = set()
        async with stack.app() as app:
            task = app.get_task("s.effect")
            t0 = time.monotonic()
            i = 0
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, t0 + i / rate - time.monotonic()))
                one = asyncio.create_task(self.one(task, f"load-{i}"))
                running.add(one)
                one.add_done_callback(running.discard)
                i += 1
            if running:
                await asyncio.gather(*running)


@dataclass
class Loaded:
    """A stack under load; ``finish`` ends it with the checks over the whole log."""

    stack: Stack
    load: Load
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def acked_past(self, count: int, timeout_s: float = 120.0) -> None:
        """Wait until ``count`` more enqueues than now were acknowledged."""
        target = len(self.load.acked) + count

        async def enough() -> bool:
            return len(self.load.acked) >= target

        await wait_for(enough, what=f"{target} acknowledged enqueues", timeout_s=timeout_s)

    async def finish(self, timeout_s: float = 300.0) -> Replay:
        """Stop the load; every acknowledged job succeeded once, and the log holds no breach."""
        self.stop.set()
        await self.task
        assert not self.load.unexpected, self.load.unexpected[:5]
        acked = list(self.load.acked)

        async def done() -> bool:
            if await all_succeeded(self.stack, acked):
                return True
            await asyncio.sleep(0.5)
            return False

        await wait_for(done, what=f"{len(acked)} acknowledged jobs to succeed", timeout_s=timeout_s)
        folded = await settled(self.stack, timeout_s)
        lost = [j for j in acked if j not in folded.jobs]
        assert not lost, f"acknowledged enqueues missing from the log: {lost[:5]}"
        unfinished = [j for j in acked if folded.jobs[j].status is not Status.SUCCEEDED]
        assert not unfinished, f"acknowledged jobs not succeeded: {unfinished[:5]}"
        return folded


async def settled(stack: Stack, timeout_s: float) -> Replay:
    """``stack.check()`` once every job in the log (acknowledged or not) has ended.

    An enqueue that failed on the client may still have reached the log (the producer keeps
    retrying it): such jobs run too, and are checked like the others.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        folded = await stack.check(all_terminal=False)
        live = {j: s.status for j, s in folded.jobs.items() if s.status not in TERMINAL_STATUSES}
        if not live:
            return folded
        assert time.monotonic() < deadline, f"jobs not terminal: {dict(list(live.items())[:5])}"
        await asyncio.sleep(1.0)


@asynccontextmanager
async def loaded_stack(bootstrap: str, tmp_path: Path, prefix: str) -> AsyncIterator[Loaded]:
    """A node, a worker and the load on a fresh namespace, once every partition leases jobs."""
    namespace = unique_name(prefix)
    await ensure_topics(bootstrap, namespace, event_partitions=PARTITIONS, queues=["default"])
    stack = Stack(bootstrap, namespace, tmp_path, partitions=PARTITIONS)
    stop = asyncio.Event()
    load = Load()
    task: asyncio.Task[None] | None = None
    try:
        stack.start_node("node-1", "--dispatch-timeout-s", "10")
        stack.start_worker("worker-1", "--concurrency", "20")
        task = asyncio.create_task(load.run(stack, stop))
        loaded = Loaded(stack, load, stop, task)
        await wait_for(
            lambda: leasing_on(stack, set(range(PARTITIONS))),
            what="the node to lease jobs on every partition",
            timeout_s=300,  # two processes' start on a loaded 2-core box
        )
        yield loaded
    finally:
        stop.set()
        if task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 120)
        await stack.close()


async def leasing_on(stack: Stack, partitions: set[int]) -> bool:
    try:
        events, _ = await stack.history()
    except UnknownTopicOrPartitionError:
        # The namespace was just created: a broker restarted by the last test may not have its
        # metadata yet and answers "unknown topic" for a moment.
        await asyncio.sleep(0.5)
        return False
    leased = {p.partition for e, p in events if isinstance(e, JobLeased)}
    if partitions <= leased:
        return True
    await asyncio.sleep(0.5)  # a probe reads the whole log: not too often
    return False


async def first_leases_after(stack: Stack, after_ms: float) -> dict[int, float]:
    """Per partition, seconds from ``after_ms`` to its first JobLeased appended after it."""
    events, _ = await stack.history()
    first: dict[int, float] = {}
    for event, position in events:
        if isinstance(event, JobLeased) and position.log_at > after_ms:
            first.setdefault(position.partition, (position.log_at - after_ms) / 1000)
    return first


def node_log_counts(stack: Stack, *names: str) -> dict[str, int]:
    """How often each event name appears in the node's log (recoveries, failed steps)."""
    text = "".join(p.log() for p in stack.procs if p.name.startswith("node"))
    return {name: text.count(f'"event": "{name}"') for name in names}
