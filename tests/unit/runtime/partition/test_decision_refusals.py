"""Decisions the fold refuses (issue 32, item 2): a planned decision the fold would refuse is never
sent, and one that comes back rejected is backed off, not proposed again from the same state on
every step; a change of the job's state ends the hold at once. Through NodeDriver, and the bounded
memory of ``runtime.partition.refusals`` on its own."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from evsched.adapters.index.store import IndexBatch
from evsched.core.bounds import MAX_TOKEN
from evsched.core.events import JobCancelled, JobLeased, JobRequeued
from evsched.core.fold import FOLD_VERSION
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status, TimelineEntry, Verdict
from evsched.metrics import NodeInstruments
from evsched.runtime.partition.quarantine import Quarantine
from evsched.runtime.partition.refusals import REFUSAL_BACKOFF_MAX_S, Refusals
from evsched.testing import FrozenClock, MemoryBroker, NodeDriver
from tests.prometheus import parse, value
from tests.unit.node_driver_events import enqueued, started, succeeded

BUDGETS = PlannerBudgets(dispatch_timeout_ms=30_000, prelease_ms=0)
Logs = list[dict[str, Any]]


@pytest.fixture
def driver_budgets() -> PlannerBudgets:
    return BUDGETS


@pytest.fixture
def logs() -> Iterator[Logs]:
    with capture_logs() as captured:
        yield captured


def lines(logs: Logs, event: str) -> Logs:
    return [line for line in logs if line["event"] == event]


async def steps(
    driver: NodeDriver, seconds: float, *, log_clock: FrozenClock | None = None
) -> None:
    """A node's steps every 50 ms for ``seconds`` (the log's clock, if apart, moves along)."""
    for _ in range(round(seconds / 0.05)):
        driver.advance(0.05)
        if log_clock is not None:
            log_clock.advance(0.05)
        await driver.step()


def client(kind: type[JobCancelled] | type[JobRequeued], job_id: str, n: int) -> Any:
    return kind(event_id=f"{kind.__name__}-{n}", job_id=job_id, emitted_at=0, source="client")


async def at_token(driver: NodeDriver, job_id: str, token: int) -> None:
    """Store the job as if it had been leased ``token`` times (2^53 leases cannot be folded in a
    test), then reopen the partition from its index as a new owner would."""
    index = driver.owner.index
    state = index.job(job_id)
    assert state is not None
    batch = IndexBatch(jobs={job_id: replace(state, token=token)}, before_jobs={job_id: state})
    index.write(batch, index.applied_offset(), FOLD_VERSION)
    await driver.restart()


# --- a decision the fold would refuse is not sent ------------------------------------------------


async def test_a_job_at_the_last_token_is_never_leased_and_its_refusals_back_off(
    driver: NodeDriver, logs: Logs
) -> None:
    """The token limit's outcome, pinned: the next lease would break bounds.MAX_TOKEN, so the
    node's dry run refuses it and nothing is sent; the job stays scheduled (an operator cancels
    it) and the refusal is logged at a doubling interval. With leases one token at a time this
    takes 2^53 - 1 leases of one job."""
    run_at = driver.clock.now_ms() + 5_000
    driver.append(enqueued("last", run_at=run_at))
    await driver.settle()
    await at_token(driver, "last", MAX_TOKEN)
    await steps(driver, 65)  # due after 5 s: refused at about 5, 6, 8, 12, 20 and 36 s, not 68
    assert driver.decisions() == [] and driver.dispatched() == []
    refused = lines(logs, "decision_refused")
    assert [line["retry_in_s"] for line in refused] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert {(line["job_id"], line["kind"]) for line in refused} == {("last", "JobLeased")}
    assert refused[0]["reason"] == f"rejected: token {MAX_TOKEN + 1} is outside [1, {MAX_TOKEN}]"
    state = driver.job("last")
    assert state is not None and (state.status, state.token) == (Status.SCHEDULED, MAX_TOKEN)
    driver.append(client(JobCancelled, "last", 1))
    await steps(driver, 1)
    assert driver.owner.refusals.refused("last") == 0  # its state changed: forgotten
    assert not driver.owner.quarantine.holds("last")
    assert driver.decisions() == [] and len(lines(logs, "decision_refused")) == 6


async def test_the_dry_run_refuses_what_the_fold_refuses_and_nothing_else(
    driver: NodeDriver, logs: Logs
) -> None:
    """Ordinary work passes the dry run: leases, expiries of started and unstarted leases,
    retries; none is refused."""
    driver.append(enqueued("a"), enqueued("b"))
    await driver.settle()
    first_a, _ = driver.dispatched()
    driver.append(started(first_a, lease_ms=1_000))
    await steps(driver, 31)  # a's run lease and b's dispatch timeout both run out
    assert driver.job("a") is not None and driver.job("b") is not None
    assert lines(logs, "decision_refused") == [] and lines(logs, "decision_rejected") == []
    again = [d for d in driver.dispatched() if d.job_id == "b"][-1]
    driver.append(started(again), succeeded(again))
    await steps(driver, 1)
    b = driver.job("b")
    assert b is not None and (b.status, b.token, b.attempt) == (Status.SUCCEEDED, 2, 1)


# --- a decision that comes back rejected is backed off ----------------------------------------


@pytest.fixture
def log_clock() -> FrozenClock:
    """The broker's clock: 10 minutes behind the node's."""
    return FrozenClock(wall_ms=1_700_000_000_000)


@pytest.fixture
def skewed(tmp_path: Path, log_clock: FrozenClock) -> Iterator[NodeDriver]:
    node_clock = FrozenClock(wall_ms=log_clock.wall_ms + 600_000)
    node = NodeDriver(tmp_path, budgets=BUDGETS, clock=node_clock, broker=MemoryBroker(log_clock))
    yield node
    node.close()


def lease_verdicts(driver: NodeDriver, job_id: str) -> list[Verdict]:
    return [e.verdict for e in driver.job_timeline(job_id) if e.kind == "JobLeased"]


async def test_decisions_rejected_as_early_are_proposed_again_after_a_doubling_back_off(
    skewed: NodeDriver, log_clock: FrozenClock, logs: Logs
) -> None:
    """A node clock 10 minutes ahead of the log's takes a job due in 10 s of log time for due:
    each lease comes back rejected (log time before run_at) until the log's time gets there;
    then the lease's end looks past to the node, and its expiries come back rejected too.
    Without a back-off each is a rejected record on every step (400 steps here)."""
    skewed.append(enqueued("early", run_at=log_clock.now_ms() + 10_000))
    await skewed.step()
    await steps(skewed, 20, log_clock=log_clock)
    assert lease_verdicts(skewed, "early") == [Verdict.REJECTED] * 4 + [Verdict.APPLIED]
    rejected = lines(logs, "decision_rejected")
    leases = [line for line in rejected if line["kind"] == "JobLeased"]
    # Proposed at about 0, 1, 3, 7 s (rejected) and 15 s (applied): 5 leases, not 200.
    assert [line["retry_in_s"] for line in leases] == [1.0, 2.0, 4.0, 8.0]
    assert {(line["job_id"], line["verdict"], line["reason"]) for line in leases} == {
        ("early", "rejected", "lease granted before the job's run_at")
    }
    assert len(skewed.decisions(JobLeased)) == 5 and len(skewed.dispatched()) == 5
    # The applied lease changed the state: its expiries start again at the first back-off
    # (proposed at about 16, 17 and 19 s of the 20).
    expiries = [line for line in rejected if line["kind"] == "LeaseExpired"]
    assert [line["retry_in_s"] for line in expiries] == [1.0, 2.0, 4.0]
    assert skewed.owner.refusals.refused("early") == 3


async def test_a_change_of_the_jobs_state_ends_the_hold_at_once(
    skewed: NodeDriver, log_clock: FrozenClock, logs: Logs
) -> None:
    skewed.append(enqueued("moved", run_at=log_clock.now_ms() + 60_000))
    await skewed.step()
    await steps(skewed, 3.5, log_clock=log_clock)  # rejected at 0, 1 and 3 s: held for 4 s
    assert skewed.owner.refusals.refused("moved") == 3
    assert skewed.owner.quarantine.holds("moved")
    # A requeue to run now: the state changed, so the next lease is planned in the same step.
    skewed.append(client(JobCancelled, "moved", 1), client(JobRequeued, "moved", 2))
    await skewed.step()
    await skewed.step()
    assert lease_verdicts(skewed, "moved")[-1] is Verdict.APPLIED
    assert skewed.owner.refusals.refused("moved") == 0
    assert len(lines(logs, "decision_rejected")) == 3


# --- the memory on its own ---------------------------------------------------------------------


def rejected_entry(
    job_id: str, event_id: str, verdict: Verdict = Verdict.REJECTED
) -> TimelineEntry:
    return TimelineEntry(
        partition=0, offset=7, log_at=0, kind="JobLeased", event_id=event_id, source="node-n1",
        verdict=verdict, reason="why",
    )  # fmt: skip


def test_the_memory_is_bounded_and_forgets_the_least_recently_refused_first() -> None:
    clock = FrozenClock()
    refusals = Refusals(0, Quarantine(0, clock), kept=2)
    for job_id in ("a", "b", "a", "c"):
        refusals.vet(job_id, "JobLeased", "rejected: no")
    assert len(refusals) == 2
    assert (refusals.refused("a"), refusals.refused("b"), refusals.refused("c")) == (2, 0, 1)


def test_the_back_off_doubles_up_to_its_cap_and_never_overflows() -> None:
    clock = FrozenClock()
    quarantine = Quarantine(0, clock)
    refusals = Refusals(0, quarantine)
    with capture_logs() as captured:
        for _ in range(2_000):
            assert not refusals.vet("j", "JobLeased", "rejected: no")
    holds = [line["retry_in_s"] for line in captured]
    assert holds[:8] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert set(holds[6:]) == {REFUSAL_BACKOFF_MAX_S}
    assert quarantine.holds("j")
    clock.advance(REFUSAL_BACKOFF_MAX_S)
    assert not quarantine.holds("j")
    assert refusals.vet("j", "JobLeased", None)  # the dry run applies it: it goes


def test_only_our_decisions_that_were_not_applied_are_held_and_they_are_counted() -> None:
    registry = CollectorRegistry()
    instruments = NodeInstruments(registry).partition(0)
    quarantine = Quarantine(0, FrozenClock(), instruments)
    refusals = Refusals(0, quarantine)
    ours = {"lease-a": ("a", 0.0), "lease-b": ("b", 0.0), "fire-s": ("s", 0.0)}
    timeline = [
        ("a", rejected_entry("a", "lease-a"), b""),
        ("b", rejected_entry("b", "lease-b", Verdict.APPLIED), b""),
        ("c", rejected_entry("c", "forged-c"), b""),  # not ours: a forger's, nothing to hold
        ("s", rejected_entry("s", "fire-s", Verdict.DUPLICATE), b""),  # another node's went first
    ]
    refusals.observe(timeline, ours)
    assert quarantine.holds("a")
    assert not any(quarantine.holds(entity) for entity in "bcs")
    refusals.vet("d", "JobPurged", "rejected: too early")
    samples = parse(generate_latest(registry).decode())
    quarantined = "evsched_node_decisions_quarantined_total"
    assert value(samples, quarantined, partition="0", stage="rejected") == 1
    assert value(samples, quarantined, partition="0", stage="fold") == 1
    refusals.observe([("a", rejected_entry("a", "enqueue-a", Verdict.APPLIED), b"")], {})
    assert not quarantine.holds("a") and refusals.refused("a") == 0


def test_an_idle_step_reads_no_timeline() -> None:
    refusals = Refusals(0, Quarantine(0, FrozenClock()))

    def unread() -> Iterator[tuple[str, TimelineEntry, bytes]]:
        raise AssertionError("read")
        yield  # pragma: no cover

    refusals.observe(unread(), {})
