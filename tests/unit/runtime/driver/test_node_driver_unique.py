"""Uniqueness scopes through NodeDriver: duplicates while a unique job is queued, an enqueue held
while it runs that the node leases as the next run once it ends, and a rebuild that agrees."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.core.events import JobEnqueued, JobLeased
from evsched.core.ids import job_id_for_unique
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status, Verdict
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import started, succeeded
from tests.unit.runtime.driver.test_node_driver_retention import rebuilt_digest

_ids = itertools.count()
JOB = job_id_for_unique("default", "t", b"[]")


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[NodeDriver]:
    node = NodeDriver(tmp_path / "node", budgets=PlannerBudgets(dispatch_timeout_ms=30_000))
    yield node
    node.close()


def enqueue(scope: str) -> JobEnqueued:
    return JobEnqueued(
        event_id=f"enq-{next(_ids)}", job_id=JOB, emitted_at=0, source="client", task="t",
        queue="default", args=b"[]", unique=scope,
    )  # fmt: skip


async def test_a_queued_scope_holds_an_enqueue_while_running_and_runs_it_next(
    driver: NodeDriver, tmp_path: Path
) -> None:
    driver.append(enqueue("queued"))
    await driver.settle()
    driver.append(enqueue("queued"))  # leased, not started: still queued
    await driver.settle()
    assert driver.job_timeline(JOB)[-1].verdict is Verdict.DUPLICATE
    [first] = driver.dispatched()
    driver.append(started(first), enqueue("queued"), enqueue("queued"))
    await driver.settle()
    held, again = driver.job_timeline(JOB)[-2:]
    assert (held.verdict, again.verdict) == (Verdict.APPLIED, Verdict.DUPLICATE)
    assert held.status_after is Status.RUNNING

    driver.append(succeeded(first))
    await driver.settle()

    state = driver.job(JOB)
    assert state is not None and (state.generation, state.status) == (1, Status.LEASED)
    assert [lease.token for lease in driver.decisions(JobLeased)] == [1, 2]
    second = driver.dispatched()[-1]
    driver.append(started(second), succeeded(second))
    await driver.settle()
    assert driver.job(JOB).status is Status.SUCCEEDED  # type: ignore[union-attr]
    assert rebuilt_digest(driver, tmp_path / "rebuilt", batch=3) == driver.owner.index.digest()


async def test_an_active_scope_is_a_duplicate_until_the_run_ends(driver: NodeDriver) -> None:
    driver.append(enqueue("active"))
    await driver.settle()
    [first] = driver.dispatched()
    driver.append(started(first), enqueue("active"))
    await driver.settle()
    assert driver.job_timeline(JOB)[-1].verdict is Verdict.DUPLICATE

    driver.append(succeeded(first), enqueue("active"))
    await driver.settle()

    state = driver.job(JOB)
    assert state is not None and (state.generation, state.status) == (1, Status.LEASED)
