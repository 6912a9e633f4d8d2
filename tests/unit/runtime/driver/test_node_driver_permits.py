"""Global concurrency limits through NodeDriver (one partition, home and jobs on it): a limited
queue's jobs are leased only with a permit, at most max_running at once, and each permit comes
back when its job ends, retries or loses its lease."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from evsched.core.events import (
    JobCancelled,
    JobEnqueued,
    JobLeased,
    KeyLimitSet,
    PermitGranted,
    PermitRequested,
    QueueLimitSet,
    QueuePermit,
)
from evsched.core.permits import KEY_LABEL
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status, Verdict
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import enqueued, failed, started, succeeded


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[NodeDriver]:
    node = NodeDriver(tmp_path, budgets=PlannerBudgets(dispatch_timeout_ms=30_000))
    yield node
    node.close()


def limit(queue: str, n: int | None, seq: int = 0) -> QueueLimitSet:
    return QueueLimitSet(
        event_id=f"limit-{queue}-{seq}", queue=queue, emitted_at=0, source="cli", max_running=n
    )


def holders(driver: NodeDriver, queue: str) -> tuple[str, ...]:
    return driver.owner.projector.limits[queue].holders


async def test_at_most_max_running_leased_and_permits_come_back(driver: NodeDriver) -> None:
    driver.append(limit("q", 2))
    driver.append(*[enqueued(f"j{i}", queue="q") for i in range(5)])
    driver.append(enqueued("free", queue="other"))
    await driver.settle()
    leased = [d.job_id for d in driver.dispatched("q")]
    assert len(leased) == 2
    assert [d.job_id for d in driver.dispatched("other")] == ["free"]
    assert sorted(holders(driver, "q")) == sorted(leased)
    first, second = driver.dispatched("q")
    driver.append(started(first), succeeded(first))
    driver.append(started(second), failed(second, retryable=False))
    await driver.settle()
    assert len(driver.dispatched("q")) == 4
    assert len(holders(driver, "q")) == 2
    for d in driver.dispatched("q")[2:]:
        driver.append(started(d), succeeded(d))
    await driver.settle()
    [last] = driver.dispatched("q")[4:]
    driver.append(started(last), succeeded(last))
    await driver.settle()
    assert holders(driver, "q") == ()
    states = driver.jobs(f"j{i}" for i in range(5))
    assert sum(1 for s in states.values() if s and s.status is Status.SUCCEEDED) == 4
    releases = [p for p in driver.decisions(QueuePermit) if p.action == "release"]
    assert len(releases) == 5


async def test_an_expired_lease_and_a_cancel_give_the_permit_back(driver: NodeDriver) -> None:
    driver.append(limit("q", 1), enqueued("a", queue="q"), enqueued("b", queue="q"))
    await driver.settle()
    [d] = driver.dispatched("q")
    driver.advance(31)  # the dispatch timeout passes: the lease expires unstarted
    await driver.settle()
    assert len(driver.dispatched("q")) == 2
    other = driver.dispatched("q")[1]
    assert other.job_id != d.job_id or other.token > d.token
    driver.append(
        JobCancelled(event_id="c", job_id=other.job_id, emitted_at=0, source="cli"),
    )
    await driver.settle()
    assert len(driver.dispatched("q")) == 3
    assert len(holders(driver, "q")) == 1


async def test_a_lease_without_a_permit_is_rejected(driver: NodeDriver) -> None:
    driver.append(limit("q", 1), enqueued("a", queue="q"), enqueued("b", queue="q"))
    await driver.settle()
    [d] = driver.dispatched("q")
    other = "b" if d.job_id == "a" else "a"
    zombie = JobLeased(
        event_id="z", job_id=other, emitted_at=0, source="node-zombie", token=1, attempt=1,
        lease_ms=30_000,
    )  # fmt: skip
    driver.append(zombie)
    await driver.settle()
    [entry] = [e for e in driver.job_timeline(other) if e.event_id == "z"]
    assert entry.verdict is Verdict.REJECTED
    assert "holds no permit" in entry.reason


async def test_hostile_permits_are_refused(driver: NodeDriver) -> None:
    driver.append(limit("q", 1), enqueued("a", queue="q"), enqueued("b", queue="q"))
    await driver.settle()
    [d] = driver.dispatched("q")
    other = "b" if d.job_id == "a" else "a"
    bad = [
        QueuePermit(event_id="w1", queue="q", job_id=other, action="request", emitted_at=0,
                    source="x"),  # waits at the home (this partition asks for 1 job only)
        QueuePermit(event_id="g1", queue="q", job_id=other, action="grant", emitted_at=0,
                    source="x"),  # beyond the limit
        QueuePermit(event_id="g2", queue="q", job_id="nobody", action="grant", emitted_at=0,
                    source="x"),  # an unknown job
        QueuePermit(event_id="r1", queue="q", job_id="nobody", action="release", emitted_at=0,
                    source="x"),  # a release of nothing
        QueuePermit(event_id="x1", queue="q", job_id="a", action="steal", emitted_at=0,
                    source="x"),
        PermitGranted(event_id="pg", job_id="ghost", emitted_at=0, source="x", queue="q"),
        PermitRequested(event_id="pr", job_id=d.job_id, emitted_at=0, source="x", queue="q"),
    ]  # fmt: skip
    driver.append(*bad)
    await driver.settle()
    timeline = driver.owner.index.permit_timeline_events("q")
    verdicts = {e.event_id: (e.verdict, e.reason) for e, _ in timeline}
    assert verdicts["g1"][0] is Verdict.REJECTED and "beyond the limit" in verdicts["g1"][1]
    assert verdicts["g2"][0] is Verdict.REJECTED and "waits for no permit" in verdicts["g2"][1]
    assert verdicts["r1"][0] is Verdict.REJECTED and "holds no permit" in verdicts["r1"][1]
    assert verdicts["x1"][0] is Verdict.REJECTED and "action" in verdicts["x1"][1]
    [ghost] = driver.job_timeline("ghost")
    assert ghost.verdict is Verdict.REJECTED and ghost.reason == "unknown job"
    pr = [e for e in driver.job_timeline(d.job_id) if e.event_id == "pr"]
    assert pr[0].verdict is Verdict.REJECTED
    assert len(driver.dispatched("q")) == 1


async def test_unlimited_queues_send_no_permit_events(driver: NodeDriver) -> None:
    driver.append(*[enqueued(f"j{i}") for i in range(3)])
    await driver.settle()
    assert driver.decisions(PermitRequested, QueuePermit, PermitGranted) == []
    assert len(driver.dispatched()) == 3


async def test_removing_the_limit_frees_waiting_jobs(driver: NodeDriver) -> None:
    driver.append(limit("q", 1), *[enqueued(f"j{i}", queue="q") for i in range(3)])
    await driver.settle()
    assert len(driver.dispatched("q")) == 1
    driver.append(limit("q", None, 1))
    await driver.settle()
    assert len(driver.dispatched("q")) == 3


def key_limit(key: str, n: int) -> KeyLimitSet:
    return KeyLimitSet(event_id=f"klimit-{key}", key=key, emitted_at=0, source="cli", max_running=n)


def keyed(job_id: str, key: str, queue: str = "default") -> JobEnqueued:
    return replace(enqueued(job_id, queue=queue), labels={KEY_LABEL: key})


async def test_a_key_limit_holds_across_queues(driver: NodeDriver) -> None:
    driver.append(key_limit("cust-1", 1))
    driver.append(keyed("a", "cust-1", "q1"), keyed("b", "cust-1", "q2"), keyed("c", "cust-2"))
    driver.append(enqueued("plain", queue="q1"))
    await driver.settle()
    leased = sorted(d.job_id for d in driver.dispatched())
    assert len([j for j in leased if j in ("a", "b")]) == 1
    assert {"c", "plain"} <= set(leased)
    [first] = [d for d in driver.dispatched() if d.job_id in ("a", "b")]
    driver.append(started(first), succeeded(first))
    await driver.settle()
    assert sorted(d.job_id for d in driver.dispatched() if d.job_id in ("a", "b")) == ["a", "b"]


async def test_a_rate_limit_grants_n_per_window_and_wakes_when_it_opens(
    driver: NodeDriver,
) -> None:
    rate = QueueLimitSet(
        event_id="rate", queue="q", emitted_at=0, source="cli", rate_starts=2, rate_per_ms=1_000
    )
    driver.append(rate, *[enqueued(f"j{i}", queue="q") for i in range(5)])
    await driver.settle()
    assert len(driver.dispatched("q")) == 2
    for d in driver.dispatched("q"):
        driver.append(started(d), succeeded(d))
    await driver.settle()
    assert len(driver.dispatched("q")) == 2  # done, but the window is not over: no spinning
    owner = driver.owner
    assert owner.next_wake_at() is not None
    driver.advance(1.2)
    await driver.settle()
    assert len(driver.dispatched("q")) == 4
    grants = [p for p in driver.decisions(QueuePermit) if p.action == "grant"]
    assert len(grants) == 4
