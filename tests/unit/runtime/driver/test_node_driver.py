"""The node's planner and partition behaviour through NodeDriver, without a broker: leases of due
and delayed jobs, lease expiry started and unstarted, retry timing, dead letters, cron fires, and
effects committed with their offset exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.core.events import Effect, JobEnqueued, JobLeased, LeaseExpired, ScheduleFired
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status
from evsched.testing import NodeDriver, SimulatedCrash
from tests.unit.node_driver_events import enqueued, every_minute, failed, started, succeeded

BUDGETS = PlannerBudgets(dispatch_timeout_ms=30_000, prelease_ms=0)
PRELEASE = PlannerBudgets(dispatch_timeout_ms=30_000, prelease_ms=1_000)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[NodeDriver]:
    node = NodeDriver(tmp_path, budgets=BUDGETS)
    yield node
    node.close()


def status(driver: NodeDriver, job_id: str) -> Status | None:
    state = driver.job(job_id)
    return None if state is None else state.status


async def test_a_due_job_is_leased_with_its_dispatch_record(driver: NodeDriver) -> None:
    driver.append(enqueued("a"))
    assert await driver.settle() == 2  # records: the lease and its dispatch
    [lease] = driver.decisions()
    assert isinstance(lease, JobLeased) and lease.job_id == "a" and lease.attempt == 1
    [dispatch] = driver.dispatched("default")
    assert (dispatch.job_id, dispatch.token) == ("a", lease.token)
    assert status(driver, "a") is Status.LEASED
    assert await driver.settle() == 0  # folded back: not proposed again


async def test_without_pre_leases_a_delayed_job_is_not_leased_before_run_at(
    driver: NodeDriver,
) -> None:
    run_at = driver.clock.now_ms() + 60_000
    driver.append(enqueued("later", run_at=run_at))
    await driver.settle()
    # Its index change goes to the changelog, and every transaction carries the offset.
    assert driver.committed_offset == 1
    assert driver.owner.next_wake_at() == run_at  # the partition sleeps until then
    driver.advance(59.999)
    await driver.settle()
    assert driver.decisions() == [] and status(driver, "later") is Status.SCHEDULED
    driver.advance(0.001)
    await driver.settle()
    [lease] = driver.decisions(JobLeased)
    assert lease.job_id == "later"
    assert driver.log()[-1].log_at >= run_at  # what the fold checks (I6)


async def test_a_delayed_job_is_pre_leased_a_horizon_before_run_at(tmp_path: Path) -> None:
    driver = NodeDriver(tmp_path, budgets=PRELEASE)
    try:
        await _pre_leased_then_started_at_run_at(driver)
    finally:
        driver.close()


async def _pre_leased_then_started_at_run_at(driver: NodeDriver) -> None:
    run_at = driver.clock.now_ms() + 60_000
    driver.append(enqueued("later", run_at=run_at))
    await driver.settle()
    driver.advance(0.5)  # the record's offset goes out alone
    await driver.settle()
    assert driver.owner.next_wake_at() == run_at - PRELEASE.prelease_ms  # a horizon early
    driver.advance(58.499)
    await driver.settle()
    assert driver.decisions(JobLeased) == [] and status(driver, "later") is Status.SCHEDULED
    driver.advance(0.001)
    await driver.settle()
    [lease] = driver.decisions(JobLeased)
    assert (lease.job_id, lease.not_before) == ("later", run_at)
    [dispatch] = driver.dispatched("default")
    assert dispatch.run_at == run_at  # the worker holds it until then
    state = driver.job("later")
    assert state is not None and state.status is Status.LEASED
    assert state.lease_until == run_at + PRELEASE.dispatch_timeout_ms  # opens at run_at
    early = started(dispatch)
    driver.append(early)  # a worker whose clock runs ahead of the log's
    await driver.settle()
    assert status(driver, "later") is Status.LEASED  # refused: started before run_at
    driver.advance(1.0)
    driver.append(started(dispatch), succeeded(dispatch))
    await driver.settle()
    assert status(driver, "later") is Status.SUCCEEDED


async def test_an_unstarted_lease_expires_after_the_dispatch_timeout_spending_no_attempt(
    driver: NodeDriver,
) -> None:
    driver.append(enqueued("a", max_attempts=1))
    await driver.settle()
    for round_ in range(1, 4):  # one attempt allowed, yet never dead: none was spent
        driver.advance(29.999)
        await driver.settle()
        assert len(driver.decisions(LeaseExpired)) == round_ - 1
        driver.advance(0.001)
        await driver.settle()  # expired, then leased again at once
        assert len(driver.decisions(LeaseExpired)) == round_
        state = driver.job("a")
        assert state is not None and state.status is Status.LEASED and state.attempt == 1
    tokens = [d.token for d in driver.dispatched()]
    assert tokens == sorted(set(tokens)) and len(tokens) == 4  # I7: tokens strictly increase
    last = driver.dispatched()[-1]
    driver.append(started(last), succeeded(last))
    await driver.settle()
    done = driver.job("a")
    assert done is not None and done.status is Status.SUCCEEDED and done.attempt == 1


async def test_a_started_lease_expires_when_its_worker_falls_silent(driver: NodeDriver) -> None:
    driver.append(enqueued("a", max_attempts=2))
    await driver.settle()
    first = driver.dispatched()[0]
    driver.append(started(first, lease_ms=10_000))
    await driver.settle()
    driver.advance(9.999)
    await driver.settle()
    assert status(driver, "a") is Status.RUNNING
    driver.advance(0.001)
    await driver.settle()
    [expiry] = driver.decisions(LeaseExpired)
    assert expiry.token == first.token
    state = driver.job("a")
    assert state is not None and state.last_error is not None
    assert state.last_error.error_type == "LeaseExpired" and state.attempt == 1
    # The retry waits its backoff (1 s), then attempt 2 goes out.
    driver.advance(1)
    await driver.settle()
    assert [d.attempt for d in driver.dispatched()] == [1, 2]


async def test_a_failed_attempt_is_retried_after_its_backoff_then_dead_lettered(
    driver: NodeDriver,
) -> None:
    driver.append(enqueued("a", max_attempts=3))
    await driver.settle()
    for attempt, backoff_s in ((1, 1.0), (2, 2.0)):
        dispatch = driver.dispatched()[-1]
        assert dispatch.attempt == attempt
        driver.append(started(dispatch), failed(dispatch))
        await driver.settle()
        state = driver.job("a")
        assert state is not None and state.status is Status.SCHEDULED
        assert state.run_at == driver.log()[-1].log_at + int(backoff_s * 1000)
        driver.advance(backoff_s - 0.001)
        await driver.settle()
        assert len(driver.dispatched()) == attempt  # not before its backoff
        driver.advance(0.001)
        await driver.settle()
        assert len(driver.dispatched()) == attempt + 1
    last = driver.dispatched()[-1]
    driver.append(started(last), failed(last))
    await driver.settle()
    dead = driver.job("a")
    assert dead is not None and dead.status is Status.DEAD and dead.attempt == 3
    driver.advance(3_600)
    assert await driver.settle() == 0  # the dead stay dead


async def test_a_permanent_failure_is_dead_at_once(driver: NodeDriver) -> None:
    driver.append(enqueued("a"))
    await driver.settle()
    dispatch = driver.dispatched()[0]
    driver.append(started(dispatch), failed(dispatch, retryable=False))
    await driver.settle()
    assert status(driver, "a") is Status.DEAD and len(driver.dispatched()) == 1


async def test_a_cron_schedule_fires_each_slot_once_even_across_a_restart(
    driver: NodeDriver,
) -> None:
    driver.clock.wall_ms = 1_700_000_000_000 - 1_700_000_000_000 % 60_000 + 30_000  # mid-minute
    driver.append(every_minute("s"))
    await driver.settle()
    assert driver.decisions() == []
    driver.advance(30)  # the next minute's slot
    await driver.settle()
    fired = driver.decisions(ScheduleFired)
    assert len(fired) == 1 and fired[0].fire_at == driver.clock.now_ms()
    # The fire's job went on the log with it and was leased.
    assert [e.job_id for e in driver.decisions(JobEnqueued)] == [fired[0].job_id]
    assert [d.job_id for d in driver.dispatched()] == [fired[0].job_id]
    await driver.restart()  # a new owner from the same index and log
    driver.advance(1)
    await driver.settle()
    assert len(driver.decisions(ScheduleFired)) == 1  # that slot is done
    driver.advance(60)
    await driver.settle()
    assert len({f.fire_at for f in driver.decisions(ScheduleFired)}) == 2


async def test_effects_are_committed_with_their_offset_exactly_once(driver: NodeDriver) -> None:
    driver.append(enqueued("a"))
    await driver.settle()
    dispatch = driver.dispatched()[0]
    [_, success] = driver.append(
        started(dispatch), succeeded(dispatch, Effect(kind="mail", payload=b"hi", key="k"))
    )
    await driver.settle()
    [effect] = driver.effects()
    assert effect.key == b"a" and effect.value == b"hi"
    assert dict(effect.headers)["evsched-token"] == str(dispatch.token).encode()
    [carrier] = [t for t in driver.broker.transactions if effect in t.records]
    assert carrier.offset is not None and carrier.offset.next_offset == success.offset + 1
    assert driver.committed_offset == success.offset + 1
    driver.advance(60)
    await driver.settle()
    await driver.restart()
    await driver.settle()
    assert len(driver.effects()) == 1 and status(driver, "a") is Status.SUCCEEDED


async def test_a_cron_fire_committed_just_before_a_crash_is_not_fired_again(
    driver: NodeDriver,
) -> None:
    driver.clock.wall_ms = 1_700_000_000_000 - 1_700_000_000_000 % 60_000 + 30_000  # mid-minute
    driver.append(every_minute("s"))
    await driver.settle()
    driver.advance(30)
    driver.crash_after_commit()  # the fire's transaction commits; its index write never happens
    with pytest.raises(SimulatedCrash):
        await driver.settle()
    assert len(driver.decisions(ScheduleFired)) == 1
    await driver.restart()
    await driver.settle()
    [fired] = driver.decisions(ScheduleFired)  # refolded from the log, not decided again
    assert [e.job_id for e in driver.decisions(JobEnqueued)] == [fired.job_id]
    assert [d.job_id for d in driver.dispatched()] == [fired.job_id]
    schedule = driver.schedule("s")
    assert schedule is not None and schedule.next_fire_at == fired.fire_at + 60_000
