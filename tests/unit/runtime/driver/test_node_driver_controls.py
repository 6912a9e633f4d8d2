"""Pause and resume through NodeDriver: a paused queue gets no lease (not even a zombie's), its
running jobs finish, and a paused schedule fires nothing, then at most its latest missed slot."""

from __future__ import annotations

from evsched.core.events import (
    JobLeased,
    QueuePaused,
    QueueResumed,
    ScheduleFired,
    SchedulePaused,
    ScheduleResumed,
)
from evsched.core.state import Status, Verdict
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import enqueued, every_minute, started, succeeded


def pause(queue: str, n: int = 0) -> QueuePaused:
    return QueuePaused(event_id=f"pause-{queue}-{n}", queue=queue, emitted_at=0, source="cli")


def resume(queue: str, n: int = 0) -> QueueResumed:
    return QueueResumed(event_id=f"resume-{queue}-{n}", queue=queue, emitted_at=0, source="cli")


async def test_a_paused_queue_is_not_leased_and_its_running_job_finishes(
    driver: NodeDriver,
) -> None:
    driver.append(enqueued("running", queue="q"))
    await driver.settle()
    [dispatch] = driver.dispatched("q")
    driver.append(started(dispatch), pause("q"), enqueued("waits", queue="q"))
    driver.append(enqueued("other", queue="default"))
    await driver.settle()
    assert [d.job_id for d in driver.dispatched()] == ["running", "other"]
    driver.append(succeeded(dispatch))  # running jobs finish
    driver.advance(120)
    await driver.settle()
    state = driver.job("running")
    assert state is not None and state.status is Status.SUCCEEDED
    waits = driver.job("waits")
    assert waits is not None and waits.status is Status.SCHEDULED
    driver.append(resume("q"))
    await driver.settle()
    assert [d.job_id for d in driver.dispatched("q")] == ["running", "waits"]


async def test_a_zombie_lease_of_a_paused_queue_is_rejected(driver: NodeDriver) -> None:
    driver.append(pause("q"), enqueued("a", queue="q"))
    await driver.settle()
    zombie = JobLeased(event_id="zombie", job_id="a", emitted_at=0, source="node-zombie",
                       token=1, attempt=1, lease_ms=30_000)  # fmt: skip
    driver.append(zombie)
    await driver.settle()
    entry = driver.job_timeline("a")[-1]
    assert (entry.kind, entry.verdict) == ("JobLeased", Verdict.REJECTED)
    assert entry.reason == "cannot lease: queue q is paused"
    state = driver.job("a")
    assert state is not None and state.status is Status.SCHEDULED and state.token == 0


async def test_a_pause_survives_a_restart(driver: NodeDriver) -> None:
    driver.append(pause("q"), pause("q", 1), enqueued("a", queue="q"))
    await driver.settle()
    [first, second] = [e for e, _ in driver.owner.index.queue_timeline_events("q")]
    assert (first.verdict, second.verdict) == (Verdict.APPLIED, Verdict.REJECTED)
    await driver.restart()
    driver.advance(5)
    await driver.settle()
    assert driver.dispatched() == []
    driver.append(resume("q"))
    await driver.settle()
    assert [d.job_id for d in driver.dispatched()] == ["a"]


async def test_a_paused_schedule_fires_nothing_then_only_its_latest_missed_slot(
    driver: NodeDriver,
) -> None:
    driver.clock.wall_ms = 1_700_000_000_000 - 1_700_000_000_000 % 60_000 + 30_000
    driver.append(every_minute("s"))
    await driver.settle()
    driver.append(SchedulePaused(event_id="sp", schedule_id="s", emitted_at=0, source="api"))
    await driver.settle()
    for _ in range(5):  # five slots pass while paused
        driver.advance(60)
        await driver.settle()
    assert driver.decisions(ScheduleFired) == []
    driver.append(ScheduleResumed(event_id="sr", schedule_id="s", emitted_at=0, source="api"))
    await driver.settle()
    fired = driver.decisions(ScheduleFired)
    latest = driver.clock.now_ms() - driver.clock.now_ms() % 60_000
    assert [f.fire_at for f in fired] == [latest]  # the missed slots collapse into the latest
    driver.advance(60)
    await driver.settle()
    assert len(driver.decisions(ScheduleFired)) == 2  # then the schedule goes on


async def test_a_pause_of_an_unknown_schedule_is_rejected(driver: NodeDriver) -> None:
    driver.append(SchedulePaused(event_id="sp", schedule_id="nope", emitted_at=0, source="api"))
    await driver.settle()
    [(entry, _)] = driver.owner.index.timeline_events("nope", schedule=True)
    assert entry.verdict is Verdict.REJECTED
