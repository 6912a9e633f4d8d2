"""Workflows through NodeDriver: a parent's accepted end releases its children exactly once, in the
transaction of its fold, and nothing else does (a stale success, a duplicate, a refold)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.core.events import ChildRegistered, JobEnqueued, ParentResolved
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status, Verdict
from evsched.testing import NodeDriver
from evsched.testing.outbox import MemoryBroker
from tests.unit.node_driver_events import enqueued, failed, started, succeeded

BUDGETS = PlannerBudgets(dispatch_timeout_ms=30_000, prelease_ms=0)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[NodeDriver]:
    node = NodeDriver(tmp_path, budgets=BUDGETS)
    yield node
    node.close()


def child(
    job_id: str, *after: str, rule: str = "all_succeeded", place: str = "none"
) -> JobEnqueued:
    return JobEnqueued(
        event_id=f"enq-{job_id}", job_id=job_id, emitted_at=0, source="client", task="t",
        queue="default", args=b'{"args":[1],"kwargs":{}}', after=after, after_rule=rule,
        results_to_args=place,
    )  # fmt: skip


def registered(parent: str, child_id: str) -> ChildRegistered:
    return ChildRegistered(
        event_id=f"reg-{parent}-{child_id}", job_id=parent, emitted_at=0, source="client",
        child_id=child_id,
    )  # fmt: skip


async def run_to_success(driver: NodeDriver, job_id: str, result: bytes = b"7") -> None:
    await driver.settle()
    [dispatch] = [d for d in driver.dispatched() if d.job_id == job_id][-1:]
    driver.append(started(dispatch))
    ok = succeeded(dispatch)
    driver.append(type(ok)(**{**_fields(ok), "result": result}))
    await driver.settle()


def _fields(event: object) -> dict[str, object]:
    return {name: getattr(event, name) for name in event.__slots__}  # type: ignore[attr-defined]


async def test_a_child_waits_then_runs_with_its_parents_result(driver: NodeDriver) -> None:
    driver.append(enqueued("a"), child("b", "a", place="append"), registered("a", "b"))
    await driver.settle()
    assert driver.job("b").status is Status.WAITING  # type: ignore[union-attr]
    assert [d.job_id for d in driver.dispatched()] == ["a"]
    await run_to_success(driver, "a", b'{"x":2}')
    [resolution] = driver.decisions(ParentResolved)
    assert (resolution.job_id, resolution.parent_id, resolution.outcome) == ("b", "a", "succeeded")
    b = driver.job("b")
    assert b is not None and b.status in (Status.SCHEDULED, Status.LEASED)
    assert b.args == b'{"args":[1,{"x":2}],"kwargs":{}}'
    [dispatch] = [d for d in driver.dispatched() if d.job_id == "b"]
    assert dispatch.args == b.args
    # the resolution travelled with the offset of the parent's success: a restart sends no other
    committed = driver.committed_offset
    assert committed is not None
    await driver.restart()
    await driver.settle()
    assert len(driver.decisions(ParentResolved)) == 1


async def test_a_stale_success_releases_nothing(driver: NodeDriver) -> None:
    driver.append(enqueued("a"), child("b", "a"), registered("a", "b"))
    await driver.settle()
    [first] = driver.dispatched()
    driver.append(started(first), failed(first))  # retried: a new token comes
    driver.advance(1)
    await driver.settle()
    driver.append(succeeded(first))  # the zombie's late success, under the old token
    await driver.settle()
    assert driver.job_timeline("a")[-1].verdict is Verdict.STALE
    assert driver.decisions(ParentResolved) == []
    assert driver.job("b").status is Status.WAITING  # type: ignore[union-attr]


async def test_a_dead_parent_cancels_the_chain_below_it(driver: NodeDriver) -> None:
    driver.append(
        enqueued("a", max_attempts=1), child("b", "a"), registered("a", "b"),
        child("c", "b"), registered("b", "c"),
    )  # fmt: skip
    await driver.settle()
    [dispatch] = driver.dispatched()
    driver.append(started(dispatch), failed(dispatch))
    await driver.settle()
    assert driver.job("b").status is Status.CANCELLED  # type: ignore[union-attr]
    assert driver.job("c").status is Status.CANCELLED  # type: ignore[union-attr]
    assert "can no longer be met" in driver.job_timeline("c")[-1].reason
    outcomes = [(r.job_id, r.outcome) for r in driver.decisions(ParentResolved)]
    assert outcomes == [("b", "dead"), ("c", "cancelled")]


async def test_a_late_registration_is_answered_at_once(driver: NodeDriver) -> None:
    driver.append(enqueued("a"))
    await run_to_success(driver, "a")
    driver.append(child("b", "a", place="list"), registered("a", "b"))
    await driver.settle()
    b = driver.job("b")
    assert b is not None and b.status is not Status.WAITING
    assert b.args == b'{"args":[1,[7]],"kwargs":{}}'
    assert "answered at once" in driver.job_timeline("a")[-1].reason


async def test_an_unknown_parent_cancels_the_child(driver: NodeDriver) -> None:
    driver.append(child("b", "ghost"), registered("ghost", "b"))
    await driver.settle()
    assert driver.job("b").status is Status.CANCELLED  # type: ignore[union-attr]
    [resolution] = driver.decisions(ParentResolved)
    assert resolution.outcome == "unknown"


async def test_a_group_callback_fires_once_over_partitions(tmp_path: Path) -> None:
    broker = MemoryBroker()
    # The callback lives on partition 0 (where unpartitioned records land); members on 1 and 2.
    home = NodeDriver(tmp_path / "0", budgets=BUDGETS, broker=broker, clock=broker.clock)
    members = [
        NodeDriver(
            tmp_path / str(p), partition=p, budgets=BUDGETS, broker=broker, clock=broker.clock
        )
        for p in (1, 2)
    ]
    try:
        home.append(child("cb", "m1", "m2", place="list"))
        for node, member in zip(members, ("m1", "m2"), strict=True):
            node.append(enqueued(member), registered(member, "cb"))
        await home.settle()
        for node, member in zip(members, ("m1", "m2"), strict=True):
            await run_to_success(node, member, b'"' + member.encode() + b'"')
        await home.settle()
        cb = home.job("cb")
        assert cb is not None and cb.status is not Status.WAITING
        assert cb.args == b'{"args":[1,["m1","m2"]],"kwargs":{}}'
        assert [e.verdict for e in home.job_timeline("cb")].count(Verdict.APPLIED) >= 3
        assert len([d for d in home.dispatched() if d.job_id == "cb"]) == 1
    finally:
        home.close()
        for node in members:
            node.close()
