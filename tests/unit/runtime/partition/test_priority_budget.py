"""Priority across a backlog and the partitions of one node: a high job behind a backlog deeper
than the scheduler's scan is the next lease; when a queue is full, the partition holding the
highest-priority due job is first in line for the next room, and the others lease only the room
beyond what the partitions ahead of them wait for; partitions of one priority take turns."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace
from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.topics import Topics
from evsched.core import planner
from evsched.core.events import JobEnqueued, JobLeased
from evsched.ports import Record
from evsched.runtime.partition.budget import QueueBudget, Waiting
from evsched.runtime.partition.partition import OwnedPartition
from evsched.testing import FrozenClock, MemoryBroker, MemoryOutbox, NodeDriver
from tests.unit.node_driver_events import enqueued as enqueued_job
from tests.unit.node_driver_events import started
from tests.unit.runtime.node.test_node_runtime import no_new_topics

TOPICS = Topics("ns")


def enqueued(partition: int, offset: int, job_id: str, priority: int = 0) -> Record:
    event = JobEnqueued(
        event_id=f"e-{job_id}", job_id=job_id, emitted_at=0, source="t", task="t", queue="q",
        args=b"[]", priority=priority,
    )  # fmt: skip
    value = avro.encode_event(event)
    return Record(TOPICS.events, partition, offset, 1_000, job_id.encode(), value)


def leased(box: MemoryOutbox) -> list[str]:
    jobs = []
    for transaction in box.sent:
        for record in transaction.records:
            if record.topic == TOPICS.events and record.value:
                event = avro.decode_event(record.value)
                if isinstance(event, JobLeased):
                    jobs.append(event.job_id)
    return jobs


async def owners(tmp_path: Path, budget: QueueBudget, count: int) -> list[OwnedPartition]:
    budgets = planner.PlannerBudgets(max_unstarted_per_queue=2)
    made = []
    for p in range(count):
        box = MemoryOutbox(MemoryBroker(FrozenClock()))
        await box.start()
        made.append(
            OwnedPartition(
                index=PartitionIndex(tmp_path / f"p{p}", p),
                topics=TOPICS,
                outbox=box,
                clock=box.broker.clock,
                group_id="ns.nodes",
                node_id="n1",
                budgets=budgets,
                committed=None,
                end_offset=0,
                ensure_queues=no_new_topics,
                budget=budget,
            )
        )
    return made


async def test_the_partition_with_the_highest_priority_due_job_gets_the_next_room(
    tmp_path: Path,
) -> None:
    budget = QueueBudget()
    p0, p1, p2 = await owners(tmp_path, budget, 3)
    woken: list[int] = []
    for owner in (p0, p1, p2):
        owner.on_wake = lambda p=owner.partition: woken.append(p)  # type: ignore[misc]
    await p0.step([enqueued(0, o, f"a{o}") for o in range(3)], 2_000, 3)  # fills q: 2 leased
    # p1 waits too, ahead of p0, which had its turn.
    await p1.step([enqueued(1, o, f"b{o}") for o in range(2)], 2_000, 2)
    assert budget.ahead(1) == {} and budget.ahead(0) == {"q": 2}
    await p2.step([enqueued(2, 0, "high", priority=5)], 2_000, 1)  # goes first in line
    assert budget.ahead(2) == {} and budget.ahead(1) == {"q": 1}
    # p0 gives its leases up: p2 is woken (not p1, which waited longer).
    p0.close()
    assert woken == [2]
    # p1 plans first: it leases only the room the line does not keep for p2's high job.
    await p1.step([], 2_001, 2)
    assert leased(p1.outbox) == ["b0"]  # type: ignore[arg-type]
    await p2.step([], 2_001, 1)
    assert leased(p2.outbox) == ["high"]  # type: ignore[arg-type]
    # Nothing of p2 waits any more: p1 is first in line and woken, but q is full again.
    assert woken == [2, 1] and budget.ahead(1) == {}
    await p1.step([], 2_002, 2)
    assert leased(p1.outbox) == ["b0"]  # type: ignore[arg-type]
    for owner in (p1, p2):
        owner.close()


class Member:
    def __init__(self) -> None:
        self.wakes = 0

    def load(self) -> object:
        raise AssertionError("not asked here")

    def wake(self) -> None:
        self.wakes += 1


def members_of(budget: QueueBudget, count: int) -> list[Member]:
    members = [Member() for _ in range(count)]
    for p, member in enumerate(members):
        budget.join(p, member)  # type: ignore[arg-type]
    return members


def test_partitions_of_one_priority_take_turns_and_a_changed_priority_moves_its_place() -> None:
    budget = QueueBudget()
    members = members_of(budget, 3)
    budget.waited(0, blocked={"q": Waiting(0, 1)}, leased=())
    budget.waited(1, blocked={"q": Waiting(0, 2)}, leased=())
    assert budget.ahead(1) == {"q": 1}  # 0 came first: its job takes the room first
    budget.waited(0, blocked={"q": Waiting(0, 1)}, leased={"q"})  # 0 had its turn: behind 1 now
    assert budget.ahead(1) == {} and budget.ahead(0) == {"q": 2} and members[1].wakes == 1
    budget.waited(2, blocked={"q": Waiting(3, 1)}, leased=())  # a higher priority goes first
    assert budget.ahead(2) == {} and members[2].wakes == 0  # it just planned
    budget.waited(0, blocked={"q": Waiting(4, 1)}, leased=())  # its best job is higher still
    assert budget.ahead(0) == {}
    budget.waited(0, blocked={"q": Waiting(-1, 1)}, leased=())  # and now lower than everyone's
    assert budget.ahead(2) == {} and budget.ahead(0) == {"q": 3}
    assert members[2].wakes == 1  # first again: there may be room
    for p in (0, 1, 2):
        budget.waited(p, blocked={}, leased=())
    assert budget.ahead(0) == {}  # nobody waits: no line


def test_a_partition_that_had_its_turn_is_passed_once_not_again_and_again() -> None:
    """At 400 jobs/s partitions kept leaving the line (all their due jobs leased) and joining
    again with new ones, each time ahead of the two that had leased as they joined: those two
    waited 20-45 s."""
    budget = QueueBudget()
    members_of(budget, 3)
    budget.waited(0, blocked={"q": Waiting(0, 1)}, leased={"q"})  # leased as it joined
    budget.waited(1, blocked={"q": Waiting(0, 1)}, leased=())  # passes 0, which had its turn
    assert budget.ahead(0) == {"q": 1}
    budget.waited(2, blocked={"q": Waiting(0, 1)}, leased=())  # but 0 is passed once only
    assert budget.ahead(2) == {"q": 2}
    budget.waited(1, blocked={}, leased={"q"})  # 1 leased all it had and left
    budget.waited(1, blocked={"q": Waiting(0, 1)}, leased=())  # new due jobs: it joins again
    assert budget.ahead(0) == {} and budget.ahead(1) == {"q": 2}  # behind 0 and 2


async def test_room_beyond_what_the_line_waits_for_is_leased_by_whoever_plans(
    tmp_path: Path,
) -> None:
    """A line that formed while the queue was full holds back no partition once the queue has
    room for all that wait: each partition may lease the room left after the jobs ahead of it
    (before, only the first in line leased, until the line was empty)."""
    clock = FrozenClock()
    broker = MemoryBroker(clock)
    budget = QueueBudget()
    budgets = planner.PlannerBudgets(max_unstarted_per_queue=3)
    d0, d1 = (
        NodeDriver(tmp_path / f"p{p}", partition=p, budgets=budgets, clock=clock, broker=broker,
                   budget=budget)
        for p in (0, 1)
    )  # fmt: skip
    try:
        d0.append(*(enqueued_job(f"a{i}") for i in range(4)))
        await d0.settle()
        assert leased_by(d0) == ["a0", "a1", "a2"]  # full; a3 waits
        d1.append(enqueued_job("b0"))
        await d1.settle()
        assert leased_by(d1) == [] and budget.ahead(0) == {"default": 1}  # 1 is first
        d0.append(*(started(d) for d in d0.dispatched()))  # room for 3: b0 and a3 both fit
        await d0.settle()
        assert leased_by(d0) == ["a0", "a1", "a2", "a3"]
        await d1.settle()
        assert leased_by(d1) == ["b0"]
    finally:
        for driver in (d0, d1):
            driver.close()


@pytest.mark.parametrize("seed", range(6))
async def test_with_jobs_arriving_all_the_time_no_partition_waits_behind_the_others(
    tmp_path: Path, seed: int
) -> None:
    """Three partitions of one node, with jobs arriving on each and starting at random, stepped
    in a random order: the queue is below its limit on average, and no job waits more than a
    few rounds for its lease, whichever partition it is on; the limit holds throughout."""
    rng = random.Random(seed)
    clock = FrozenClock()
    broker = MemoryBroker(clock)
    budget = QueueBudget()
    limit = 8
    budgets = planner.PlannerBudgets(max_unstarted_per_queue=limit)
    drivers = [
        NodeDriver(tmp_path / f"p{p}", partition=p, budgets=budgets, clock=clock, broker=broker,
                   budget=budget)
        for p in range(3)
    ]  # fmt: skip
    jobs = itertools.count()
    enqueued_in: dict[str, int] = {}
    waits: list[int] = []
    try:
        for round_ in range(60):
            for driver in drivers:
                fresh = [f"j{next(jobs)}" for _ in range(rng.randint(1, 2))]
                enqueued_in.update((job_id, round_) for job_id in fresh)
                mine = [d for d in driver.dispatched() if d.partition == driver.partition]
                leased = [d for d in mine if status(driver, d.job_id) == "leased"]
                driver.append(*(enqueued_job(j) for j in fresh))
                driver.append(*(started(d) for d in leased if rng.random() < 0.8))
            for driver in rng.sample(drivers, len(drivers)):
                await driver.settle()
                assert budget.total().unstarted.get("default", 0) <= limit
            for driver in drivers:
                for d in driver.dispatched():
                    if d.job_id in enqueued_in and d.partition == driver.partition:
                        waits.append(round_ - enqueued_in.pop(d.job_id))
        # Waits were up to 28 rounds before the line kept room for its jobs only, with 20-65
        # jobs still unleased at the end; now 3 at most (seed 1), most jobs none.
        assert max(waits) <= 4 and all(r > round_ - 4 for r in enqueued_in.values())
    finally:
        for driver in drivers:
            driver.close()


def leased_by(driver: NodeDriver) -> list[str]:
    return [d.job_id for d in driver.dispatched() if d.partition == driver.partition]


def status(driver: NodeDriver, job_id: str) -> str | None:
    state = driver.job(job_id)
    return state.status.value if state else None


def due(driver: NodeDriver) -> int:
    """Due jobs not leased yet (a lease the partition has not folded back holds its job)."""
    owner = driver.owner
    return len(owner.index.due_by_priority(2**62, 10_000, skip=owner._held_back))


async def test_a_high_job_behind_a_backlog_deeper_than_the_scan_is_leased_next(
    tmp_path: Path,
) -> None:
    """The scan reads 5 due jobs a step; 30 older low jobs wait. The high job, enqueued last,
    is still the next lease once the window has room (by run_at it would be 31st)."""
    driver = NodeDriver(
        tmp_path, scan_limit=5, budgets=planner.PlannerBudgets(max_unstarted_per_queue=2)
    )
    driver.append(*[enqueued_job(f"low{i:02d}") for i in range(30)])
    await driver.settle()
    first = driver.dispatched()
    assert [d.job_id for d in first] == ["low00", "low01"]  # the window is full
    driver.advance(1)
    driver.append(replace(enqueued_job("high"), priority=3))
    await driver.settle()
    assert len(driver.dispatched()) == 2  # still full: the high job waits, scheduled
    driver.append(started(first[0]))
    await driver.settle()
    assert [d.job_id for d in driver.dispatched()[2:]] == ["high"]
    driver.append(started(first[1]))
    await driver.settle()
    assert [d.job_id for d in driver.dispatched()[3:]] == ["low02"]
    driver.close()
