"""Priority across a backlog and the partitions of one node: a high job behind a backlog deeper
than the scheduler's scan is the next lease; when a queue is full, the partition holding the
highest-priority due job is first in line for the next room, and the others lease none of that
queue meanwhile; partitions of one priority still take turns."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from evsched.adapters import avro
from evsched.adapters.index import PartitionIndex
from evsched.adapters.topics import Topics
from evsched.core import planner
from evsched.core.events import JobEnqueued, JobLeased
from evsched.ports import Record
from evsched.runtime.budget import QueueBudget
from evsched.runtime.partition import OwnedPartition
from evsched.testing import FrozenClock, MemoryBroker, MemoryOutbox, NodeDriver
from tests.unit.node_driver_events import enqueued as enqueued_job
from tests.unit.node_driver_events import started
from tests.unit.test_node_runtime import no_new_topics

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
    limits = planner.PlannerLimits(max_unstarted_per_queue=2)
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
                limits=limits,
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
    assert budget.not_my_turn(1) == set() and budget.not_my_turn(0) == {"q"}
    await p2.step([enqueued(2, 0, "high", priority=5)], 2_000, 1)  # goes first in line
    assert budget.not_my_turn(2) == set() and budget.not_my_turn(1) == {"q"}
    # p0 gives its leases up: p2 is woken (not p1, which waited longer) and leases.
    p0.close()
    assert woken == [2]
    await p1.step([], 2_001, 2)  # not its turn: leases nothing
    await p2.step([], 2_001, 1)
    assert leased(p1.outbox) == [] and leased(p2.outbox) == ["high"]  # type: ignore[arg-type]
    # Nothing of p2 waits any more: p1 is first in line, woken, and takes the last room.
    assert woken == [2, 1] and budget.not_my_turn(1) == set()
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


def test_partitions_of_one_priority_take_turns_and_a_changed_priority_moves_its_place() -> None:
    budget = QueueBudget()
    members = [Member() for _ in range(3)]
    for p, member in enumerate(members):
        budget.join(p, member)  # type: ignore[arg-type]
    budget.waited(0, blocked={"q": 0}, leased=())
    budget.waited(1, blocked={"q": 0}, leased=())
    assert budget.not_my_turn(1) == {"q"}  # 0 came first
    budget.waited(0, blocked={"q": 0}, leased={"q"})  # 0 had its turn: behind 1 now
    assert budget.not_my_turn(1) == set() and members[1].wakes == 1
    budget.waited(2, blocked={"q": 3}, leased=())  # a higher priority goes first
    assert budget.not_my_turn(2) == set() and members[2].wakes == 0  # it just planned
    budget.waited(0, blocked={"q": 4}, leased=())  # its best job is now higher still
    assert budget.not_my_turn(0) == set()
    budget.waited(0, blocked={"q": -1}, leased=())  # and now lower than everyone's
    assert budget.not_my_turn(2) == set() and budget.not_my_turn(0) == {"q"}
    assert members[2].wakes == 1  # first again: there may be room
    for p in (0, 1, 2):
        budget.waited(p, blocked={}, leased=())
    assert budget.not_my_turn(0) == set()  # nobody waits: no line


async def test_a_high_job_behind_a_backlog_deeper_than_the_scan_is_leased_next(
    tmp_path: Path,
) -> None:
    """The scan reads 5 due jobs a step; 30 older low jobs wait. The high job, enqueued last,
    is still the next lease once the window has room (by run_at it would be 31st)."""
    driver = NodeDriver(
        tmp_path, scan_limit=5, limits=planner.PlannerLimits(max_unstarted_per_queue=2)
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
