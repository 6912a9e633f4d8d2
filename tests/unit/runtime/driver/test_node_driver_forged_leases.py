"""Forged leases through NodeDriver (issue 32, item 2): a JobLeased off the job's next token is
rejected, the node then leases the job itself at the next token and it runs to success, and no
decision is proposed again and again for one job state."""

from __future__ import annotations

from collections import Counter

import pytest

from evsched.core.bounds import MAX_TOKEN
from evsched.core.events import JobLeased, LeaseExpired
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status, Verdict
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import enqueued, started, succeeded

BUDGETS = PlannerBudgets(dispatch_timeout_ms=30_000, prelease_ms=0)
# At most this many proposals of one decision for one job state, over any window.
N = 3


@pytest.fixture
def driver_budgets() -> PlannerBudgets:
    return BUDGETS


def forged(job_id: str, token: int, attempt: int = 1) -> JobLeased:
    """What a producer with write access to the events topic can send: any token it likes."""
    return JobLeased(
        event_id=f"forged-{job_id}-{token}", job_id=job_id, emitted_at=0, source="node-forger",
        token=token, attempt=attempt, lease_ms=0,
    )  # fmt: skip


async def steps(driver: NodeDriver, count: int, seconds: float = 0.05) -> None:
    """``count`` steps a little apart, as a node's poll loop makes them."""
    for _ in range(count):
        driver.advance(seconds)
        await driver.step()


def proposals_per_state(driver: NodeDriver) -> Counter[tuple[str, str, int, int]]:
    """How often the node sent each decision: (job, kind, token, attempt) names the job state
    it was planned from (a lease's token and attempt are the state's plus one)."""
    return Counter(
        (e.job_id, type(e).__name__, e.token, getattr(e, "attempt", 0))
        for e in driver.decisions(JobLeased, LeaseExpired)
    )


def timeline(driver: NodeDriver, job_id: str) -> list[tuple[str, Verdict, str]]:
    return [(e.kind, e.verdict, e.reason) for e in driver.job_timeline(job_id)]


@pytest.mark.parametrize("token", [MAX_TOKEN, 5], ids=["max_token", "current_plus_5"])
async def test_a_forged_lease_on_a_due_job_is_rejected_and_the_node_leases_it_next(
    driver: NodeDriver, token: int
) -> None:
    driver.append(enqueued("victim"), forged("victim", token))
    await driver.settle()
    assert timeline(driver, "victim")[1] == (
        "JobLeased",
        Verdict.REJECTED,
        f"lease token {token}, expected token 1",
    )
    [lease] = driver.decisions(JobLeased)
    assert (lease.token, lease.attempt, lease.source) == (1, 1, "node-driver")
    [dispatch] = driver.dispatched()
    driver.append(started(dispatch), succeeded(dispatch))
    await steps(driver, 200)  # 10 s of a node's steps: nothing more to propose
    state = driver.job("victim")
    assert state is not None and (state.status, state.token, state.attempt) == (
        Status.SUCCEEDED,
        1,
        1,
    )
    assert len(driver.dispatched()) == 1  # the handler ran once
    assert max(proposals_per_state(driver).values()) <= N


async def test_forged_leases_after_an_unstarted_lease_name_the_next_token(
    driver: NodeDriver,
) -> None:
    """A job at token 1, scheduled again after its lease expired unstarted: a forger's leases at
    token 1 + 5 and at the largest token are rejected; the node's next lease is token 2."""
    driver.append(enqueued("victim"))
    await driver.settle()
    driver.advance(BUDGETS.dispatch_timeout_ms / 1000)  # no worker came
    await driver.step()  # proposes the expiry
    [expiry] = driver.decisions(LeaseExpired)
    driver.append(forged("victim", 6), forged("victim", MAX_TOKEN))  # right behind the expiry
    await driver.settle()
    rows = timeline(driver, "victim")
    assert rows[2][:2] == ("LeaseExpired", Verdict.APPLIED) and expiry.token == 1
    assert rows[3:5] == [
        ("JobLeased", Verdict.REJECTED, "lease token 6, expected token 2"),
        ("JobLeased", Verdict.REJECTED, f"lease token {MAX_TOKEN}, expected token 2"),
    ]
    assert [(e.token, e.attempt) for e in driver.decisions(JobLeased)] == [(1, 1), (2, 1)]
    last = driver.dispatched()[-1]
    driver.append(started(last), succeeded(last))
    await steps(driver, 200)
    state = driver.job("victim")
    assert state is not None and (state.status, state.token) == (Status.SUCCEEDED, 2)
    assert max(proposals_per_state(driver).values()) <= N
