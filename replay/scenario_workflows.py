"""The ``workflows`` recording (fold version 4): jobs waiting on parents, released exactly once.

A chain of three whose middle step fails once and is retried; a group of twelve over the three
partitions with a callback; a chain cut by a dead parent (the rest cancelled in turn); a zombie
parent's stale success, which releases nothing; a registration after the parent ended (answered at
once) and one for an unknown parent; and a hostile producer's workflow events: a self-dependency,
a resolution of an unknown child, one from a parent the child does not wait on, and a repeat of a
real resolution (duplicate).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from replay.scenarios import produce_raw, until_status
from tests.integration.engine import Stack, wait_for

from evsched.adapters import avro
from evsched.adapters.ids import new_id
from evsched.client import App, chain, group
from evsched.core.events import (
    AttemptSucceeded,
    ChildRegistered,
    Event,
    JobEnqueued,
    ParentResolved,
    entity_id,
)
from evsched.core.state import Status


async def workflows(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "5")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    async with stack.app() as app:
        plus, total = app.get_task("s.plus"), app.get_task("s.total")
        fail = app.get_task("s.always_fail")
        done = await app.enqueue_workflow(chain(plus.s(1, 0), plus.s(10, 1), plus.s(100, 0)))
        fan = await app.enqueue_workflow(
            group([plus.s(i, 0) for i in range(12)], callback=total.s()), key="fan-1"
        )
        cut = await app.enqueue_workflow(chain(fail.s(), plus.s(1, 0), plus.s(2, 0)))
        zombie_parent, zombie_child = await _zombie(stack, app)
        await done.last.result(timeout=120)
        late = await plus.options(after=[done.job_ids[0]]).enqueue(5, 0)
        orphan = await plus.options(after=["no-such-parent"]).enqueue(5, 0)
        jobs = [*done.job_ids, *fan.job_ids, *cut.job_ids, zombie_parent, zombie_child]
        await until_status(stack, [*jobs, late, orphan])
    await produce_raw(stack, await _hostile(stack, fan.last))
    await _folded(stack)
    assert (await stack.job(cut.last)).status is Status.CANCELLED  # type: ignore[union-attr]


async def _zombie(stack: Stack, app: App) -> tuple[str, str]:
    """A parent run by a gated task, and a forged success of a token before its own."""
    marks = stack.tmp / "zombie"
    marks.mkdir()
    gated, noop = app.get_task("s.gated"), app.get_task("s.noop")
    parent = await gated.enqueue(str(marks), "parent")
    child = await noop.options(after=[parent]).enqueue()
    await wait_for(lambda: _any(marks, "started-*"), what="the parent to start", timeout_s=120)
    running = await stack.wait_status(parent, Status.RUNNING)
    forged = AttemptSucceeded(
        event_id=new_id(), job_id=parent, emitted_at=0, source="worker-zombie",
        token=running.token - 1, result=b'"forged"',
    )  # fmt: skip
    await app.publish(forged)

    async def judged() -> bool:
        return any(e.source == "worker-zombie" for e in await stack.timeline(parent))

    await wait_for(judged, what="the zombie's success to be folded", timeout_s=120)
    await asyncio.to_thread((marks / "go").touch)
    return parent, child


async def _hostile(stack: Stack, callback: str) -> list[tuple[bytes, bytes]]:
    events, _ = await stack.history()
    real = next(e for e, _ in events if isinstance(e, ParentResolved) and e.job_id == callback)
    meta = {"emitted_at": 0, "source": "forger"}
    forged: list[Event] = [
        JobEnqueued(
            event_id=new_id(), job_id="self-waiter", task="s.noop", queue="default", args=b"{}",
            after=("self-waiter",), **meta,  # type: ignore[arg-type]
        ),
        ChildRegistered(event_id=new_id(), job_id="x", child_id="x", **meta),  # type: ignore[arg-type]
        replace(real, event_id=new_id(), job_id="no-such-child"),
        replace(real, event_id=new_id(), parent_id="not-a-parent"),
        replace(real, event_id=new_id(), source="forger"),  # a repeat: duplicate
    ]  # fmt: skip
    return [(entity_id(e).encode(), avro.encode_event(e)) for e in forged]


async def _folded(stack: Stack) -> None:
    """Until the node has folded everything on the log (its answers included)."""
    for _ in range(2):  # a registration's answer lands after the registration is folded
        end = await stack.read_topic(stack.topics.events)
        for partition in range(stack.partitions):
            offsets = [r.offset for r in end if r.partition == partition]
            if offsets:
                await stack.wait_node_past(partition, max(offsets))


async def _any(folder: Path, pattern: str) -> bool:
    return await asyncio.to_thread(lambda: any(folder.glob(pattern)))
