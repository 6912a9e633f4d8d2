"""Lease planning from index entries (``runtime.partition.lease_plan``): it leases exactly what
reading every due job's state leases and leaves the same jobs waiting in the node's line, it decodes
only
the jobs it leases (a backlog behind a full queue is not read), it falls back to the full read
where an entry cannot stand for its state, and a node's outputs are byte for byte the same."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from evsched.adapters.index.priority import DUE_PRIORITY, DueEntry, priority_key
from evsched.core.events import (
    Event,
    JobEnqueued,
    KeyLimitSet,
    QueueLimitSet,
    QueuePaused,
    QueueResumed,
)
from evsched.core.permits import KEY_LABEL
from evsched.core.planner import PlannerBudgets
from evsched.ports import Record
from evsched.runtime.partition.budget import QueueBudget, Waiting
from evsched.runtime.partition.lease_plan import waiting_by_queue
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.projection.projector import Folded
from evsched.testing import FrozenClock, MemoryBroker, NodeDriver
from tests.unit.node_driver_events import started, succeeded

QUEUES = ("a", "b", "c", "side")


def job(
    job_id: str,
    *,
    queue: str,
    priority: int = 0,
    run_at: int | None = None,
    labels: dict[str, str] | None = None,
) -> JobEnqueued:
    return JobEnqueued(
        event_id=f"enq-{job_id}", job_id=job_id, emitted_at=0, source="client", task="t",
        queue=queue, args=b"[]", run_at=run_at, priority=priority, labels=labels or {},
    )  # fmt: skip


def limit(queue: str, running: int) -> QueueLimitSet:
    return QueueLimitSet(
        event_id=f"limit-{queue}", queue=queue, emitted_at=0, source="cli", max_running=running
    )


def pause(queue: str, n: int = 0) -> QueuePaused:
    return QueuePaused(event_id=f"pause-{queue}-{n}", queue=queue, emitted_at=0, source="cli")


def resume(queue: str, n: int = 0) -> QueueResumed:
    return QueueResumed(event_id=f"resume-{queue}-{n}", queue=queue, emitted_at=0, source="cli")


def backlog(rng: random.Random, prefix: str, count: int, now: int) -> list[Event]:
    return [
        job(
            f"{prefix}{i:04d}",
            queue=rng.choice(QUEUES),
            priority=rng.randint(-2, 2),
            run_at=now + rng.randint(-5_000, 5_000),
        )
        for i in range(count)
    ]


def assert_same_plans(owner: OwnedPartition, folded: Folded, now: int) -> int:
    """Plan at ``now`` both ways on the same index and batch; returns how many were leased."""
    load = owner._lease_load()
    lean = owner.lean.plan(folded, now, load)
    assert lean is not None
    lean_asks = owner.permits.take(now, folded)  # the permit requests planning made
    full = owner._plan_read_all(folded, now, load)
    assert owner.permits.take(now, folded) == lean_asks
    assert lean[0] == full[0]
    # What the node's line is told: the queues left waiting, by their best priority.
    assert waiting_by_queue(*lean) == waiting_by_queue(*full)
    return len(full[0])


@pytest.mark.parametrize("seed", range(8))
async def test_planning_from_entries_leases_what_reading_every_state_leases(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    budgets = PlannerBudgets(
        max_in_flight_per_queue=rng.randint(2, 12),
        max_unstarted_per_queue=rng.randint(1, 6),
        prelease_ms=rng.choice([0, 1_000]),
    )
    clock = FrozenClock()
    broker = MemoryBroker(clock)
    budget = QueueBudget() if seed % 2 else None
    scan_limit = rng.choice([3, 25, 1_000])
    drivers = [
        NodeDriver(
            tmp_path / f"n{p}",
            partition=p,
            budgets=budgets,
            clock=clock,
            broker=broker,
            scan_limit=scan_limit,
            budget=budget,
        )
        for p in (0, 1)
    ]
    driver, other = drivers
    try:
        now = clock.now_ms()
        other.append(*backlog(rng, "o", 60, now))
        limited = [limit("c", 3)] if seed >= 4 else []  # its jobs need permits
        driver.append(*limited, *backlog(rng, "j", 200, now), pause("side"))
        for node in drivers:
            await node.settle()
        driver.append(*(started(d) for d in driver.dispatched()[::2]))
        driver.append(*backlog(rng, "k", 30, now))
        await driver.step()  # its leases are pending (held back) until folded
        owner = driver.owner
        # Folded, not committed: both ways read these jobs and the resume through the batch.
        fresh = driver.append(*backlog(rng, "m", 30, now), resume("side"))
        log = driver.broker.records(driver.topics.events, 0, owner.projector.next_offset)
        assert log[-len(fresh) :] == fresh
        folded = owner.projector.fold(log)
        for ms in (0, 2_000, 6_000):
            assert_same_plans(owner, folded, now + ms)
        assert waiting_by_queue(*owner._plan_read_all(folded, now, owner._lease_load()))
    finally:
        for node in drivers:
            node.close()


async def test_a_backlog_behind_a_full_queue_is_not_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = NodeDriver(tmp_path, budgets=PlannerBudgets(max_unstarted_per_queue=5))
    try:
        driver.append(*(job(f"full{i:04d}", queue="full", priority=1) for i in range(600)))
        driver.append(*(job(f"open{i}", queue="open") for i in range(8)))
        await driver.settle()
        assert len(driver.dispatched("full")) == len(driver.dispatched("open")) == 5
        driver.append(*(started(d) for d in driver.dispatched("open")[:2]))  # room for two
        owner = await driver.restart()  # no state cached: every state read decodes
        log = driver.broker.records(driver.topics.events, 0, owner.projector.next_offset)
        folded = owner.projector.fold(log)
        decoded: list[str] = []
        read = owner.index.job

        def counted(job_id: str) -> Any:
            decoded.append(job_id)
            return read(job_id)

        monkeypatch.setattr(owner.index, "job", counted)
        now = driver.clock.now_ms()
        lean = owner.lean.plan(folded, now, owner._lease_load())
        assert lean is not None
        assert sorted(decoded) == ["open5", "open6"] == sorted(s.event.job_id for s in lean[0])
        # Of each queue's entries only its room and one more are kept: the best one left waits.
        assert sorted(c.job_id for c in lean[1]) == ["full0005", "open5", "open6", "open7"]
        # The line is told the best priority left waiting and how many wait (those not kept too).
        assert waiting_by_queue(*lean) == {"full": Waiting(1, 595), "open": Waiting(0, 1)}
        decoded.clear()
        full = owner._plan_read_all(folded, now, owner._lease_load())
        assert full[0] == lean[0] and waiting_by_queue(*full) == waiting_by_queue(*lean)
        # The full read decodes every due job (open5 and open6 are cached by now).
        assert sorted(decoded) == [f"full{i:04d}" for i in range(5, 600)] + ["open7"]
    finally:
        driver.close()


async def test_an_entry_that_cannot_stand_for_its_state_is_decoded_or_read_in_full(
    tmp_path: Path,
) -> None:
    driver = NodeDriver(tmp_path, budgets=PlannerBudgets(max_unstarted_per_queue=2))
    try:
        driver.append(*(job(f"j{i}", queue="q", priority=i % 3) for i in range(9)), pause("p"))
        driver.append(job("epoch", queue="q", run_at=0), job("paused", queue="p"))
        driver.append(*(job(f"x{i}", queue="x") for i in range(3)))
        await driver.settle()
        owner = driver.owner
        family = owner.index._cf[DUE_PRIORITY]
        now = driver.clock.now_ms()
        entries = owner.index.due_entries(now, 100)
        assert {e.queue for e in entries} == {"", "q", "p", "x"}  # run_at 0: the key may clamp
        epoch = next(e for e in entries if e.job_id == "epoch")
        assert epoch == DueEntry("epoch", 0, 0, "")
        # Entries from before the family kept queues: the states are read instead.
        for e in entries:
            family[priority_key(e.priority, e.run_at, e.job_id)] = b""
        assert {e.queue for e in owner.index.due_entries(now, 100)} == {""}
        driver.append(*(started(d) for d in driver.dispatched("q")))
        driver.append(job("late", queue="q", priority=9))
        log = driver.broker.records(driver.topics.events, 0, owner.projector.next_offset)
        folded = owner.projector.fold(log)
        assert assert_same_plans(owner, folded, now) == 2
        # An entry that disagrees with its job's state: the step reads every state instead.
        stale = owner.index.due_entries(now, 1)[0]
        family[priority_key(stale.priority, stale.run_at, stale.job_id)] = b"elsewhere"
        assert owner.lean.plan(folded, now, owner._lease_load()) is None
        leases = owner._plan_leases(folded, now)
        assert [lease.event.job_id for lease in leases] == ["late", stale.job_id]
    finally:
        driver.close()


def wire(records: list[Record]) -> list[tuple[str, int | None, bytes | None, Any, Any]]:
    return [(r.topic, r.partition, r.key, r.value, r.headers) for r in records]


async def test_a_node_under_a_backlog_sends_byte_for_byte_what_the_full_read_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets = PlannerBudgets(max_unstarted_per_queue=20, max_in_flight_per_queue=40)
    lean = NodeDriver(tmp_path / "lean", budgets=budgets)
    full = NodeDriver(tmp_path / "full", budgets=budgets)
    await full.open()
    monkeypatch.setattr(full.owner.lean, "plan", lambda *args: None)
    rng = random.Random(15)
    now = lean.clock.now_ms()
    # A backlog deeper than the scan's window, on a queue that fills at once, ahead of most of
    # the rest (jobs of a lower priority stay hidden behind it, as before).
    events: list[Event] = [job(f"full{i:05d}", queue="full", priority=3) for i in range(1_500)]
    events += [job(f"open{i:03d}", queue="open", priority=rng.randint(0, 4)) for i in range(60)]
    events += [
        job(f"later{i:02d}", queue="open", priority=5, run_at=now + 2_500) for i in range(20)
    ]
    events += [pause("side"), *(job(f"side{i}", queue="side", priority=4) for i in range(10))]
    try:
        await run_both(lean, full, events, rounds=8, seed=15, later={4: [resume("side")]})
        assert {"full", "open", "side"} <= {d.queue for d in lean.dispatched()}
        assert lean.decisions() == full.decisions()
    finally:
        lean.close()
        full.close()


async def run_both(
    lean: NodeDriver,
    full: NodeDriver,
    events: list[Event],
    *,
    rounds: int,
    seed: int,
    later: dict[int, list[Event]] | None = None,
) -> None:
    """The same log to both nodes, and the same worker's answers to what the lean one sent
    (and ``later[round]`` after that round), each round compared byte for byte."""
    rng = random.Random(seed)
    for node in (lean, full):
        node.append(*events)
    for round_ in range(rounds):
        for node in (lean, full):
            await node.settle(max_steps=500)
        assert wire(lean.sent()) == wire(full.sent())
        work: list[Event] = []
        for d in lean.dispatched()[-30:]:
            work += [started(d), succeeded(d)] if rng.random() < 0.7 else [started(d)]
        work += (later or {}).get(round_, [])
        for node in (lean, full):
            node.append(*work)
            node.advance(1)


async def test_with_global_limits_the_node_sends_what_the_full_read_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budgets = PlannerBudgets(max_unstarted_per_queue=15, max_in_flight_per_queue=30)
    lean = NodeDriver(tmp_path / "lean", budgets=budgets)
    full = NodeDriver(tmp_path / "full", budgets=budgets)
    await full.open()
    monkeypatch.setattr(full.owner.lean, "plan", lambda *args: None)
    await lean.open()
    plans: list[object] = []
    plan = lean.owner.lean.plan

    def spied(*args: Any) -> Any:
        plans.append(planned := plan(*args))
        return planned

    monkeypatch.setattr(lean.owner.lean, "plan", spied)
    # A limited queue (its jobs ask for permits, wait for grants, are read in full) among a
    # full queue's backlog deeper than the scan's window and an open queue; a key's limit.
    events: list[Event] = [limit("lim", 4)]
    events += [job(f"lim{i:03d}", queue="lim", priority=3) for i in range(200)]
    events += [job(f"full{i:05d}", queue="full", priority=2) for i in range(1_200)]
    events += [job(f"open{i:03d}", queue="open", priority=i % 4) for i in range(40)]
    # A key's limit over two queues, and jobs of a key without one.
    events.append(KeyLimitSet(event_id="lk", key="k", emitted_at=0, source="cli", max_running=2))
    events += [
        job(f"key{i:03d}", queue=("open", "keyed")[i // 2 % 2], priority=3, labels={KEY_LABEL: k})
        for i, k in enumerate(["k", "free"] * 40)
    ]
    try:
        await run_both(lean, full, events, rounds=8, seed=7)
        assert {"full", "open", "lim", "keyed"} <= {d.queue for d in lean.dispatched()}
        assert plans and None not in plans  # every step planned from the entries
    finally:
        lean.close()
        full.close()


async def test_jobs_under_a_key_limit_are_read_in_full_and_the_others_from_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    driver = NodeDriver(tmp_path, budgets=PlannerBudgets(max_unstarted_per_queue=1))
    try:
        key = KeyLimitSet(event_id="limit-k", key="k", emitted_at=0, source="cli", max_running=1)
        driver.append(key, *(job(f"j{i}", queue="q", labels={KEY_LABEL: "k"}) for i in range(3)))
        driver.append(*(job(f"f{i}", queue="q", labels={KEY_LABEL: "free"}) for i in range(3)))
        driver.append(*(job(f"o{i}", queue="o", priority=1) for i in range(3)))
        await driver.settle()
        assert [d.job_id for d in driver.dispatched()] == ["o0", "f0"]
        owner = await driver.restart()  # no state cached: every state read decodes
        entries = {e.job_id: e for e in owner.index.due_entries(driver.clock.now_ms(), 100)}
        assert (entries["j1"].key, entries["f1"].key, entries["o1"].key) == ("k", "free", "")
        decoded: list[str] = []
        read = owner.index.job

        def counted(job_id: str) -> Any:
            decoded.append(job_id)
            return read(job_id)

        monkeypatch.setattr(owner.index, "job", counted)
        driver.append(*(started(d) for d in driver.dispatched()))  # room in both queues
        log = driver.broker.records(driver.topics.events, 0, owner.projector.next_offset)
        folded = owner.projector.fold(log)
        decoded.clear()
        now = driver.clock.now_ms()
        lean = owner.lean.plan(folded, now, owner._lease_load())
        assert lean is not None and len(lean[0]) == 2
        # The jobs the key's limit holds for, and the two leased (o1, and f1: its key is free).
        assert sorted(decoded) == ["f1", "j0", "j1", "j2", "o1"]
        owner.permits.take(now, folded)
        assert assert_same_plans(owner, folded, now) == 2
    finally:
        driver.close()
