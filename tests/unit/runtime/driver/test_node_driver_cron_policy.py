"""Cron policies through NodeDriver: a paused schedule with a catch-up window fires its missed
slots one by one on resume and skips those before the window; jittered jobs run at their derived
time; every decision reads in the schedule's timeline."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from evsched.core import ids
from evsched.core.events import JobEnqueued, ScheduleFired, SchedulePaused, ScheduleResumed
from evsched.core.planner import PlannerBudgets
from evsched.core.schedule import policy as cron_policy
from evsched.core.state import Status, Verdict
from evsched.operator.audit import audit
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import every_minute, started, succeeded

MINUTE = 60_000


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[NodeDriver]:
    node = NodeDriver(tmp_path, budgets=PlannerBudgets(dispatch_timeout_ms=30_000))
    node.clock.wall_ms = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE + 30_000
    yield node
    node.close()


def reasons(driver: NodeDriver, schedule_id: str) -> list[str]:
    timeline = driver.owner.index.timeline_events(schedule_id, schedule=True)
    return [entry.reason for entry, _ in timeline if entry.kind == "ScheduleFired"]


async def test_on_resume_missed_slots_in_the_window_fire_in_order_and_older_ones_are_skipped(
    driver: NodeDriver,
) -> None:
    driver.append(replace(every_minute("s"), catchup_window_ms=3 * MINUTE))
    await driver.settle()
    driver.append(SchedulePaused(event_id="sp", schedule_id="s", emitted_at=0, source="api"))
    await driver.settle()
    for _ in range(6):  # six slots pass while paused
        driver.advance(60)
        await driver.settle()
    assert driver.decisions(ScheduleFired) == []

    driver.append(ScheduleResumed(event_id="sr", schedule_id="s", emitted_at=0, source="api"))
    await driver.settle()

    now = driver.clock.now_ms()
    latest = now - now % MINUTE
    fired = driver.decisions(ScheduleFired)
    assert [(f.fire_at, f.decision) for f in fired] == [
        (latest - 3 * MINUTE, cron_policy.MISSED),  # the slots before the window: no job
        (latest - 2 * MINUTE, cron_policy.CAUGHT_UP),
        (latest - MINUTE, cron_policy.CAUGHT_UP),
        (latest, None),
    ]
    jobs = driver.decisions(JobEnqueued)
    assert [j.fire_at for j in jobs] == [f.fire_at for f in fired[1:]]
    readings = reasons(driver, "s")
    assert readings[0].startswith(f"skipped slots from {latest - 5 * MINUTE} to ")
    assert readings[1].startswith(f"caught up slot {latest - 2 * MINUTE} as job ")
    assert readings[3].startswith(f"fired slot {latest} as job ")
    timeline = driver.owner.index.timeline_events("s", schedule=True)
    assert all(e.verdict is Verdict.APPLIED for e, _ in timeline)


async def test_a_jittered_fire_enqueues_its_job_at_the_derived_time(driver: NodeDriver) -> None:
    driver.append(replace(every_minute("j"), max_jitter_ms=20_000))
    await driver.settle()
    driver.advance(60)
    await driver.settle()

    [fired] = driver.decisions(ScheduleFired)
    [job] = driver.decisions(JobEnqueued)
    offset = cron_policy.jitter_ms("j", fired.fire_at, 20_000)
    assert fired.run_at == job.run_at == fired.fire_at + offset
    assert reasons(driver, "j")[0].endswith(f"(+{offset} ms)") or offset == 0
    state = driver.job(job.job_id)
    assert state is not None and state.run_at == fired.fire_at + offset


async def test_a_skip_policy_fires_nothing_while_the_previous_job_runs(driver: NodeDriver) -> None:
    driver.append(replace(every_minute("k"), overlap="skip"))
    await driver.settle()
    driver.advance(60)
    await driver.settle()
    [first] = driver.dispatched()
    driver.append(started(first, lease_ms=600_000))  # a slow job
    await driver.settle()

    driver.advance(60)  # the next slot while the job runs
    await driver.settle()
    job_id = ids.job_id_for_runs("k")
    assert first.job_id == job_id
    assert driver.job_timeline(job_id)[-1].verdict is Verdict.DUPLICATE
    assert len(driver.dispatched()) == 1

    driver.append(succeeded(first))
    driver.advance(60)
    await driver.settle()
    state = driver.job(job_id)
    assert state is not None and (state.generation, state.status) == (1, Status.LEASED)
    assert [f.job_id for f in driver.decisions(ScheduleFired)] == [job_id] * 3


async def test_the_audit_of_the_schedule_reads_each_decision(driver: NodeDriver) -> None:
    driver.append(replace(every_minute("a"), catchup_window_ms=MINUTE, max_jitter_ms=5_000))
    await driver.settle()
    for _ in range(3):
        driver.advance(60)
    await driver.settle()

    found = audit(driver.owner.index, "a")

    assert found is not None
    fires = [row.reading for row in found.rows if row.entry.kind == "ScheduleFired"]
    assert fires[0].startswith("node-driver at slot ") and "catch-up window" in fires[0]
    assert any(": caught up slot " in reading or ": fired slot " in reading for reading in fires)
    assert all(row.refolded is row.entry.verdict for row in found.rows)
