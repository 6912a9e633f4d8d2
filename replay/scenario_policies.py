"""The ``policies`` run: uniqueness scopes and cron policies (issue 13, items 7 and 8) on real
processes.

Kept apart from ``scenarios.py``; ``record.py`` records it and ``tests/integration/
test_policies.py`` runs it and judges the log.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import UTC, datetime

from replay.scenarios import _logged, produce_raw, until_node_past_the_end, until_status
from tests.integration.engine import REPO, Stack, wait_for, wait_path

from evsched.adapters import avro
from evsched.adapters.clock import now_ms
from evsched.client import App
from evsched.core import ids
from evsched.core.events import JobEnqueued, ScheduleFired
from evsched.core.invariants import Replay, replay
from evsched.core.schedule import policy as cron_policy
from evsched.core.state import ScheduleState, Status, Verdict

EVERY_2S = "* * * * * */2"
CATCH_UP = "catch-up"
SKIP = "skip"
BACKFILL = "backfill"
UNIQUE_TAG = "unique"


async def policies(stack: Stack) -> None:
    """A unique job enqueued again while queued (duplicate), while running (held, then its next
    run) and after it ended; a schedule with a catch-up window and jitter whose only node is
    stopped for longer than the window, then another node started; a schedule with overlap
    skip and a slow job (its fires while the job runs are duplicates); a backfill by the CLI,
    repeated (no second job), and a hostile one of a slot still to come (rejected)."""
    node = stack.start_node("node-1")
    stack.start_worker("worker-1", "--lease-s", "3")
    await wait_for(lambda: _logged(node, "partition_assigned"), what="node up")
    async with stack.app() as app:
        await _unique(stack, app)
        await _skip(stack, app)
        await _catch_up(stack, app)
        await _backfill(stack, app)
    await until_node_past_the_end(stack)


async def _unique(stack: Stack, app: App) -> None:
    marks = stack.tmp / "unique"
    marks.mkdir()
    task = app.get_task("s.gated").options(unique="queued")
    first = await task.enqueue(str(marks), UNIQUE_TAG)
    again = await task.enqueue(str(marks), UNIQUE_TAG)  # not started yet: a duplicate
    assert first == again
    await wait_path(marks / "started-1-1")
    await task.enqueue(str(marks), UNIQUE_TAG)  # running: held for the next run
    await task.enqueue(str(marks), UNIQUE_TAG)  # a duplicate of the held one
    (marks / "go").touch()
    await _until(stack, first, generation=1, status=Status.SUCCEEDED)
    active = app.get_task("s.noop").options(unique="active")
    done = await active.enqueue()
    await until_status(stack, [done], Status.SUCCEEDED)
    await active.enqueue()  # the run ended: a new run of the id
    await _until(stack, done, generation=1, status=Status.SUCCEEDED)


async def _skip(stack: Stack, app: App) -> None:
    """A schedule every 2 s with overlap skip and a job that runs until told: its fires while
    the job runs are duplicates of it; once it ends, the next fire is a new run."""
    marks = stack.tmp / "skip"
    marks.mkdir()
    await app.upsert_schedule(
        SKIP, EVERY_2S, "UTC", "s.gated", args=[str(marks), SKIP], overlap="skip"
    )
    await wait_path(marks / "started-1-1")
    await _fires(stack, SKIP, 3)  # two slots at least pass while the job runs
    (marks / "go").touch()
    await _until(stack, ids.job_id_for_runs(SKIP), generation=1, status=Status.SUCCEEDED)
    await app.delete_schedule(SKIP)
    await until_node_past_the_end(stack)


async def _catch_up(stack: Stack, app: App) -> None:
    """Fires, then the only node stops for 12 s: on its return the slots of the last 5 s
    fire one by one (caught up) and the older ones are skipped as missed."""
    await app.upsert_schedule(CATCH_UP, EVERY_2S, "UTC", "s.noop", catchup_window=5, max_jitter=1.5)
    await _fires(stack, CATCH_UP, 2)
    await until_node_past_the_end(stack)
    node = next(p for p in stack.procs if p.name == "node-1")
    assert node.stop() == 0
    stopped = now_ms()
    await wait_for(lambda: _after(stopped + 12_000), what="slots to pass", timeout_s=30)
    restarted = stack.start_node("node-2")  # a log of its own: it must fold the log itself
    await wait_for(lambda: _logged(restarted, "partition_assigned"), what="node back")
    await _decided(stack, CATCH_UP, cron_policy.MISSED)
    await _decided(stack, CATCH_UP, cron_policy.CAUGHT_UP)
    await app.delete_schedule(CATCH_UP)
    await until_node_past_the_end(stack)


async def _backfill(stack: Stack, app: App) -> None:
    await app.upsert_schedule(BACKFILL, "* * * * * */5", "UTC", "s.noop")
    await until_node_past_the_end(stack)
    created = (await _schedule(stack, BACKFILL)).created_at
    start, end = created - 20_000, created - 10_000  # before the schedule's own slots
    for _ in range(2):  # the second backfill makes no second job
        await asyncio.to_thread(_cli_backfill, stack, start, end)
    later = now_ms() + 60_000
    slot = cron_policy.backfill_slots(await _schedule(stack, BACKFILL), later, later + 10_000)
    await produce_raw(stack, [_hostile_backfill(slot[0])])
    await app.delete_schedule(BACKFILL)
    await until_node_past_the_end(stack)
    events, _ = await stack.history()
    fired = sorted({e.job_id for e, _ in events if isinstance(e, JobEnqueued) and e.schedule_id})
    await until_status(stack, fired)


def _cli_backfill(stack: Stack, start: int, end: int) -> None:
    args = ["schedules", "backfill", BACKFILL, "--from", _iso(start), "--to", _iso(end)]
    data = ["--data-dir", str(stack.tmp / f"cli-{os.urandom(3).hex()}"), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "evsched", *args, *data],
        cwd=REPO,
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _hostile_backfill(slot: int) -> tuple[bytes, bytes]:
    fire = ScheduleFired(
        event_id="hostile-backfill", schedule_id=BACKFILL, emitted_at=0, source="mallory",
        fire_at=slot, job_id=ids.job_id_for_fire(BACKFILL, slot),
        decision=cron_policy.BACKFILLED,
    )  # fmt: skip
    return BACKFILL.encode(), avro.encode_event(fire)


async def _after(moment_ms: int) -> bool:
    return now_ms() >= moment_ms


async def _folded(stack: Stack) -> Replay:
    events, _ = await stack.history()
    return replay(events)


async def _schedule(stack: Stack, schedule_id: str) -> ScheduleState:
    state = (await _folded(stack)).schedules.get(schedule_id)
    assert state is not None
    return state


async def _until(stack: Stack, job_id: str, *, generation: int, status: Status) -> None:
    async def there() -> bool:
        state = await stack.job(job_id)
        return state is not None and (state.generation, state.status) == (generation, status)

    await wait_for(there, what=f"run {generation} of {job_id} {status}", timeout_s=120)


async def _fires(stack: Stack, schedule_id: str, count: int) -> None:
    async def enough() -> bool:
        timeline = (await _folded(stack)).schedule_timelines.get(schedule_id, [])
        fired = [e for e in timeline if e.kind == "ScheduleFired" and e.verdict is Verdict.APPLIED]
        return len(fired) >= count

    await wait_for(enough, what=f"{count} applied fires of {schedule_id}", timeout_s=60)


async def _decided(stack: Stack, schedule_id: str, decision: str) -> None:
    async def seen() -> bool:
        events, _ = await stack.history()
        return any(
            isinstance(e, ScheduleFired) and e.schedule_id == schedule_id and e.decision == decision
            for e, _ in events
        )

    await wait_for(seen, what=f"a {decision} fire of {schedule_id}", timeout_s=60)
