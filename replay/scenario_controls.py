"""The ``controls`` run: pause and resume of a queue and of a schedule on real processes.

Kept apart from ``scenarios.py``; ``record.py`` records it and ``tests/integration/
test_controls.py`` runs it and judges the log.
"""

from __future__ import annotations

from collections.abc import Iterable

from replay.scenarios import _logged, produce_raw, until_node_past_the_end, until_status
from tests.integration.engine import Stack, wait_for, wait_path

from evsched.adapters import avro
from evsched.adapters.clock import now_ms
from evsched.client import App
from evsched.core.events import JobEnqueued, JobLeased, ScheduleFired
from evsched.core.invariants import Replay, replay
from evsched.core.state import Status, TimelineEntry, Verdict

EVERY_2S = "* * * * * */2"


async def controls(stack: Stack) -> None:
    """A paused queue leases nothing (a zombie's lease is rejected) while its running job
    finishes; a paused schedule fires nothing (a zombie's fire is rejected), then only its
    latest missed slot; pauses and resumes repeated or of unknown schedules are rejected."""
    node = stack.start_node("node-1")
    stack.start_worker("worker-1", "--lease-s", "3")
    await wait_for(lambda: _logged(node, "partition_assigned"), what="node up")
    async with stack.app() as app:
        marks = stack.tmp / "gated"
        marks.mkdir()
        running = await app.enqueue("s.gated", str(marks), "running")
        await wait_path(marks / "started-1-1")
        await app.pause_queue("default", reason="maintenance")
        waiting = [await app.enqueue("s.noop") for _ in range(6)]
        await app.pause_queue("default")  # already paused: rejected on every partition
        (marks / "go").touch()  # the running job finishes while the queue is paused
        await until_status(stack, [running], Status.SUCCEEDED)
        await until_node_past_the_end(stack)
        await produce_raw(stack, [_zombie_lease(waiting[0])])
        await until_node_past_the_end(stack)
        folded = await _folded(stack)
        for job_id in waiting:  # not one lease applied, the zombie's included
            state = folded.jobs[job_id]
            assert state.status is Status.SCHEDULED and state.token == 0, state
        await app.resume_queue("default")
        await until_status(stack, waiting, Status.SUCCEEDED)
        await app.resume_queue("default")  # not paused: rejected
        await _schedule(stack, app)
    await until_node_past_the_end(stack)


async def _schedule(stack: Stack, app: App) -> None:
    await app.upsert_schedule("every-2s", EVERY_2S, "UTC", "s.noop")
    await _fired(stack, 1)
    await app.pause_schedule("every-2s", reason="holiday")
    await app.pause_schedule("never-made")  # unknown: rejected
    paused_at = now_ms()
    await wait_for(
        lambda: _after(paused_at + 5_000), what="slots to pass while paused", timeout_s=30
    )
    await until_node_past_the_end(stack)
    before = await _fires(stack)
    slot = now_ms() // 2_000 * 2_000
    await produce_raw(stack, [_zombie_fire(slot)])
    await until_node_past_the_end(stack)
    assert await _fires(stack) == before, "a paused schedule fired"
    await app.resume_schedule("every-2s")
    await _fired(stack, len(before) + 1)
    await app.delete_schedule("every-2s")
    await until_node_past_the_end(stack)
    events, _ = await stack.history()
    fired = sorted({e.job_id for e, _ in events if isinstance(e, JobEnqueued) and e.schedule_id})
    await until_status(stack, fired)


async def _after(moment_ms: int) -> bool:
    return now_ms() >= moment_ms


async def _folded(stack: Stack) -> Replay:
    events, _ = await stack.history()
    return replay(events)


def _applied_fires(timeline: Iterable[TimelineEntry]) -> list[int]:
    return [
        e.offset for e in timeline if e.kind == "ScheduleFired" and e.verdict is Verdict.APPLIED
    ]


async def _fires(stack: Stack) -> list[int]:
    """Offsets of the schedule's applied fires, as the fold judges the whole log now."""
    return _applied_fires((await _folded(stack)).schedule_timelines.get("every-2s", []))


async def _fired(stack: Stack, count: int) -> None:
    """Until ``count`` fires are applied: the probe reads the replica's timeline of the schedule,
    which trails the log but never shows a fire the log's fold would not apply."""

    async def enough() -> bool:
        return len(_applied_fires(await stack.timeline("every-2s"))) >= count

    await wait_for(enough, what=f"{count} applied fires", timeout_s=60)


def _zombie_lease(job_id: str) -> tuple[bytes, bytes]:
    lease = JobLeased(event_id="zombie-lease", job_id=job_id, emitted_at=0,
                      source="node-zombie", token=1, attempt=1, lease_ms=30_000)  # fmt: skip
    return job_id.encode(), avro.encode_event(lease)


def _zombie_fire(slot: int) -> tuple[bytes, bytes]:
    fire = ScheduleFired(event_id="zombie-fire", schedule_id="every-2s", emitted_at=0,
                         source="node-zombie", fire_at=slot, job_id="zombie-job")  # fmt: skip
    return b"every-2s", avro.encode_event(fire)
