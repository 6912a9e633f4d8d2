"""The node's partition when things go wrong, through NodeDriver without a broker: a crash
between the transaction and the index write, a fenced owner, a refused record, a commit that
fails, hostile records, and the per-queue budgets that keep leases from piling up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.core.events import Effect, JobLeased, LeaseExpired
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status, Verdict
from evsched.errors import BrokerUnavailable, Fenced, RecordRefused
from evsched.runtime.partition.quarantine import QUARANTINE_S
from evsched.testing import NodeDriver, SimulatedCrash
from tests.unit.node_driver_events import enqueued, started, succeeded

# Leases outlive every wait below: no expiry mixes in.
LONG_LEASES = PlannerBudgets(dispatch_timeout_ms=600_000)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[NodeDriver]:
    node = NodeDriver(tmp_path, budgets=LONG_LEASES)
    yield node
    node.close()


async def test_a_crash_between_commit_and_index_write_refolds_and_sends_nothing_twice(
    driver: NodeDriver,
) -> None:
    driver.append(enqueued("a"), enqueued("b"))
    await driver.settle()
    dispatch = driver.dispatched()[0]
    driver.append(started(dispatch), succeeded(dispatch, Effect(kind="mail", payload=b"x")))
    driver.crash_after_commit()
    with pytest.raises(SimulatedCrash):
        await driver.settle()
    assert len(driver.effects()) == 1 and driver.committed_offset == driver.log()[-1].offset + 1
    applied = driver.owner.index.applied_offset()
    assert applied < driver.log()[-1].offset  # the index lags the committed offset
    owner = await driver.restart()
    assert owner.resume_offset == applied + 1
    await driver.settle()
    assert len(driver.effects()) == 1  # the gap was refolded without sending
    assert driver.owner.stats["records"] >= 2
    assert [e.job_id for e in driver.decisions(JobLeased)] == ["a", "b"]
    state = driver.job(dispatch.job_id)
    assert state is not None and state.status is Status.SUCCEEDED
    assert driver.owner.index.applied_offset() == driver.log()[-1].offset


async def test_a_fenced_owner_fails_its_step_and_writes_nothing_to_the_index(
    driver: NodeDriver,
) -> None:
    driver.append(enqueued("a"))
    await driver.settle()
    applied = driver.owner.index.applied_offset()
    driver.fence()  # a newer owner took the partition's transactional id
    driver.append(enqueued("b"))
    with pytest.raises(Fenced):
        await driver.step()
    assert driver.owner.index.applied_offset() == applied
    assert driver.job("b") is None
    assert [e.job_id for e in driver.decisions(JobLeased)] == ["a"]


async def test_a_failed_commit_fails_the_step_and_a_new_owner_redoes_it(
    driver: NodeDriver,
) -> None:
    driver.append(enqueued("a"))
    driver.outbox.fail_next_commit()
    with pytest.raises(BrokerUnavailable):
        await driver.settle()
    assert driver.sent() == [] and driver.owner.index.applied_offset() == -1
    await driver.restart()  # what the node does: drop the partition, reopen it from its index
    await driver.settle()
    assert [e.job_id for e in driver.decisions(JobLeased)] == ["a"]


async def test_a_refused_record_quarantines_its_decision_while_the_partition_proceeds(
    driver: NodeDriver,
) -> None:
    refused = {"big"}
    driver.outbox.refuse(lambda o: "RecordTooLarge" if o.key.decode() in refused else None)
    driver.append(enqueued("a"), enqueued("big"), enqueued("c"))
    await driver.settle()
    assert sorted(e.job_id for e in driver.decisions(JobLeased)) == ["a", "c"]
    assert driver.owner.quarantine.holds("big") and driver.job("big") is not None
    driver.append(enqueued("d"))
    await driver.settle()
    assert sorted(d.job_id for d in driver.dispatched()) == ["a", "c", "d"]
    refused.clear()  # the cause went away (a topic repaired)
    driver.advance(QUARANTINE_S)
    await driver.settle()
    assert sorted(d.job_id for d in driver.dispatched()) == ["a", "big", "c", "d"]


async def test_a_refused_effect_fails_the_step_and_is_never_held_back(
    driver: NodeDriver,
) -> None:
    driver.outbox.refuse(lambda o: "too large" if o.topic == driver.topics.effects else None)
    driver.append(enqueued("a"))
    await driver.settle()
    dispatch = driver.dispatched()[0]
    driver.append(started(dispatch), succeeded(dispatch, Effect(kind="k", payload=b"x")))
    with pytest.raises(RecordRefused):
        await driver.settle()
    assert driver.effects() == [] and driver.job("a") is not None
    state = driver.job("a")
    assert state is not None and state.status is Status.LEASED  # the index did not move


async def test_hostile_records_never_stop_the_partition(driver: NodeDriver) -> None:
    foreign = enqueued("x")
    driver.append_raw(b"\x00\x01 not avro", key=b"junk")
    driver.append_raw(None, key=b"tombstone")
    driver.append_raw(b"\xc3\x01" + bytes(8) + b"unknown schema fingerprint")
    driver.append_raw(avro.encode_event(foreign)[:-3], key=b"x")  # truncated
    driver.append(
        LeaseExpired(event_id="forged", job_id="nobody", emitted_at=0, source="node-x", token=9)
    )
    driver.append(enqueued("ok"))
    await driver.settle()
    assert [e.job_id for e in driver.decisions(JobLeased)] == ["ok"]
    undecodable = driver.owner.index.undecodable()
    assert len(undecodable) == 4 and all(e.verdict is Verdict.UNDECODABLE for e in undecodable)
    assert driver.owner.index.applied_offset() == driver.log()[-1].offset


async def test_the_in_flight_limit_holds_per_queue_and_frees_as_jobs_finish(
    tmp_path: Path,
) -> None:
    driver = NodeDriver(tmp_path, budgets=PlannerBudgets(max_in_flight_per_queue=2))
    driver.append(*(enqueued(f"q{i}") for i in range(4)), enqueued("o", queue="other"))
    await driver.settle()
    assert sorted(d.job_id for d in driver.dispatched()) == ["o", "q0", "q1"]
    first = driver.dispatched("default")[0]
    driver.append(started(first), succeeded(first))
    await driver.settle()
    assert len(driver.dispatched("default")) == 3  # one finished: one more goes out
    driver.close()


async def test_backpressure_keeps_unstarted_jobs_scheduled_not_expiring_in_dispatch(
    tmp_path: Path,
) -> None:
    # Moved from tests/integration/test_node_hardening.py: a slow pool (2 at a time, 0.25 s each)
    # against a short dispatch timeout. Leasing all 20 at once expired most of them unstarted.
    budgets = PlannerBudgets(dispatch_timeout_ms=2_000, max_unstarted_per_queue=4)
    driver = NodeDriver(tmp_path, budgets=budgets)
    jobs = [f"j{i}" for i in range(20)]
    driver.append(*(enqueued(j) for j in jobs))
    await driver.settle()
    done: set[str] = set()
    for _ in range(20):
        assert len(driver.dispatched()) - len(done) <= 4  # never more unstarted than 4
        for d in [d for d in driver.dispatched() if d.job_id not in done][:2]:  # 2 at a time
            driver.append(started(d))
            driver.advance(0.25)  # 20 jobs take 5 s, well past the 2 s dispatch timeout
            driver.append(succeeded(d))
            done.add(d.job_id)
        await driver.settle()
        if done == set(jobs):
            break
    assert done == set(jobs) and driver.decisions(LeaseExpired) == []
    assert all(
        state is not None and state.status is Status.SUCCEEDED
        for state in driver.jobs(jobs).values()
    )
    driver.close()
