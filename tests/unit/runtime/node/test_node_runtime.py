"""The node's runtime parts without a broker: a decision that cannot be encoded or sent is
quarantined while the rest of the step goes out, the per-node queue budget, partition health for
/readyz, an index released when its partition fails to open, and a replica that survives a fold
failure on one partition."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.rdkafka_group import RdkafkaGroupConsumer
from evsched.adapters.kafka.topics import Topics
from evsched.core import planner
from evsched.core.events import JobEnqueued
from evsched.core.state import Status
from evsched.devstack.process import free_port
from evsched.errors import BrokerUnavailable, PartitionRevoked
from evsched.metrics import NodeInstruments, serve_metrics
from evsched.ports import Record
from evsched.runtime.node.health import NodeHealth
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.node import Node, NodeConfig
from evsched.runtime.partition import partition as partition_module
from evsched.runtime.partition.budget import QueueBudget, QueueLoad
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.partition.quarantine import Quarantine, Unusable
from evsched.runtime.replica import Replica
from evsched.settings import Settings
from evsched.testing import FrozenClock, MemoryBroker, MemoryOutbox, MemoryPartitionLog
from tests.prometheus import parse, value

TOPICS = Topics("ns")


def outbox(refuse: set[str] = frozenset()) -> MemoryOutbox:  # type: ignore[assignment]
    """An outbox twin that refuses records of the topics in ``refuse``."""
    box = MemoryOutbox(MemoryBroker(FrozenClock()))
    box.refuse(lambda o: "MessageSizeTooLargeError()" if o.topic in refuse else None)
    return box


def committed(box: MemoryOutbox) -> list[tuple[str, bytes]]:
    return [(r.topic, r.value or b"") for t in box.sent for r in t.records]


async def no_new_topics(queues: set[str]) -> Mapping[str, Unusable]:
    return {}


def enqueued(offset: int, job_id: str, queue: str) -> Record:
    event = JobEnqueued(
        event_id=f"e-{job_id}", job_id=job_id, emitted_at=0, source="t", task="t", queue=queue,
        args=b"[]",
    )  # fmt: skip
    return Record(TOPICS.events, 0, offset, 1_000, job_id.encode(), avro.encode_event(event))


async def owned(tmp_path: Path, box: MemoryOutbox, **options: Any) -> OwnedPartition:
    await box.start()
    return OwnedPartition(
        index=PartitionIndex(tmp_path / "p0000", 0),
        topics=TOPICS,
        outbox=box,
        clock=box.broker.clock,
        group_id="ns.nodes",
        node_id="n1",
        budgets=planner.PlannerBudgets(),
        committed=None,
        end_offset=0,
        ensure_queues=no_new_topics,
        **options,
    )


async def test_a_decision_that_cannot_be_sent_is_quarantined_and_the_rest_go_out(
    tmp_path: Path,
) -> None:
    box = outbox(refuse={TOPICS.dispatch("huge")})
    owner = await owned(tmp_path, box)
    records = [enqueued(0, "a", "default"), enqueued(1, "b", "huge"), enqueued(2, "c", "default")]
    await owner.step(records, 2_000, 3)
    leased = {avro.decode_event(v).job_id for t, v in committed(box) if t == TOPICS.events}
    assert leased == {"a", "c"}
    assert owner.quarantine.holds("b") and len(owner.quarantine) == 1
    assert owner.index.applied_offset() == 2  # the step committed
    assert owner.pending.entities.keys() == {"a", "c"}  # b is not waited for
    await owner.step([], 2_001, 3)  # held back: not proposed again at once
    assert len(committed(box)) == 4
    owner.close()


async def test_a_decision_that_cannot_be_encoded_is_quarantined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = avro.encode_dispatch

    def encode(dispatch: Any) -> bytes:
        if dispatch.job_id == "b":
            raise OverflowError("token out of range")
        return real(dispatch)

    monkeypatch.setattr(partition_module.avro, "encode_dispatch", encode)
    box = outbox()
    registry = CollectorRegistry()
    instruments = NodeInstruments(registry)
    owner = await owned(tmp_path, box, instruments=instruments.partition(0))
    await owner.step([enqueued(0, "a", "default"), enqueued(1, "b", "default")], 2_000, 2)
    assert {avro.decode_event(v).job_id for t, v in committed(box) if t == TOPICS.events} == {"a"}
    assert owner.quarantine.holds("b")
    samples = parse(generate_latest(registry).decode())
    quarantined = "evsched_node_decisions_quarantined_total"
    assert value(samples, quarantined, partition="0", stage="encode") == 1
    owner.close()


async def test_the_budget_is_shared_by_partitions_and_full_queues_serve_them_in_turn(
    tmp_path: Path,
) -> None:
    budget = QueueBudget()
    budgets = planner.PlannerBudgets(max_in_flight_per_queue=3)
    boxes = [outbox(), outbox()]
    for box in boxes:
        await box.start()
    owners = [
        OwnedPartition(
            index=PartitionIndex(tmp_path / f"p{p}", p),
            topics=TOPICS,
            outbox=boxes[p],
            clock=boxes[p].broker.clock,
            group_id="ns.nodes",
            node_id="n1",
            budgets=budgets,
            committed=None,
            end_offset=0,
            ensure_queues=no_new_topics,
            budget=budget,
        )
        for p in (0, 1)
    ]
    woken: list[int] = []
    for p, owner in enumerate(owners):
        owner.on_wake = lambda p=p: woken.append(p)  # type: ignore[misc]
    await owners[0].step([enqueued(o, f"a{o}", "q") for o in range(5)], 2_000, 5)
    await owners[1].step([enqueued(o, f"b{o}", "q") for o in range(2)], 2_000, 2)
    # 3 leases on partition 0 fill the queue: partition 1 waits, and is first in line (partition
    # 0 had its turn); its two jobs take the next room before partition 0's.
    assert budget.total() == QueueLoad(in_flight={"q": 3}, unstarted={"q": 3})
    assert budget.ahead(0) == {"q": 2} and budget.ahead(1) == {}
    # Partition 0 gives its leases up (closed): the first in line is woken and leases both.
    owners[0].close()
    assert woken == [1] and owners[1].woken
    await owners[1].step([], 2_001, 2)
    assert budget.total() == QueueLoad(in_flight={"q": 2}, unstarted={"q": 2})
    assert budget.ahead(1) == budget.ahead(0) == {}  # nothing left waiting: no line
    owners[1].close()


def test_health_names_failing_partitions_and_backs_off() -> None:
    health = NodeHealth()
    assert health.readiness() == (
        False,
        "not ready: the node has not joined its consumer group yet",
    )
    health.assigned([0, 1])
    assert health.readiness()[0] is True
    for partition in (0, 1):
        health.move(partition, Phase.OPENING)
        health.move(partition, Phase.CATCHING_UP)
    assert health.failed(1, "step failed: OSError()") == 1
    health.move(1, Phase.OPENING)
    assert health.failed(1, "step failed: OSError()") == 2
    assert health.retry_in_s(1) == 2.0 and health.retry_in_s(0) == 1.0
    ready, text = health.readiness()
    assert not ready
    assert text == "partition 1 failing: step failed: OSError()\nphases: p0 catching_up, p1 failed"
    health.move(1, Phase.OPENING)
    health.move(1, Phase.CATCHING_UP)
    health.stepped(1, caught_up=True)
    assert health.readiness() == (
        True,
        "ready: 2 partitions assigned, none failing\nphases: p0 catching_up, p1 running",
    )
    health.failed(0, "open failed")
    health.closed(0)
    health.assigned([1])  # no longer ours: no longer a problem of this node
    assert health.readiness()[0] is True


async def test_readyz_and_process_metrics_are_served_next_to_metrics() -> None:
    health = NodeHealth()
    health.assigned([3])
    health.move(3, Phase.OPENING)
    health.failed(3, "step failed: boom")
    port = free_port()
    server = serve_metrics(CollectorRegistry(), port, readiness=health.readiness)
    try:
        async with httpx.AsyncClient() as http:
            ready = await http.get(f"http://127.0.0.1:{port}/readyz")
            metrics = await http.get(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
    assert ready.status_code == 503 and "partition 3 failing: step failed: boom" in ready.text
    assert "process_cpu_seconds_total" in metrics.text and "python_info" in metrics.text


class RefusingConsumer:
    def pause(self, partition: int) -> None:
        pass

    def seek(self, partition: int, offset: int) -> None:
        raise PartitionRevoked("not assigned any more")


async def test_an_index_opened_for_a_partition_that_then_fails_is_closed(tmp_path: Path) -> None:
    node = Node(NodeConfig(settings=Settings(namespace="ns"), node_id="n", data_dir=tmp_path))
    consumer = cast(RdkafkaGroupConsumer, RefusingConsumer())
    node.health.assigned([0])
    assert await node.opener.index(consumer, 0) is None
    assert node.health.phase(0) is Phase.FAILED
    await node.threads.stop()
    PartitionIndex(tmp_path / "p0000", 0).close()  # no "LOCK: No locks available"


async def test_a_replica_partition_whose_fold_fails_is_retried_and_the_loop_lives_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    replica = Replica(Settings(namespace="ns"), tmp_path)
    for p in (0, 1):
        replica.projectors[p] = partition_module.Projector(PartitionIndex(tmp_path / f"p{p}", p))
    log = MemoryPartitionLog(TOPICS.events, partitions=2)
    log.append(0, enqueued(0, "x", "q").value, key=b"x", log_at=1_000)
    log.append(1, enqueued(0, "y", "q").value, key=b"y", log_at=1_000)
    broken = replica.projectors[0]
    calls = 0
    real_commit = broken.commit

    def commit(folded: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OverflowError("index key")
        real_commit(folded)

    seeks: list[tuple[int, int]] = []
    real_seek = log.seek

    def seek(partition: int, offset: int) -> None:
        seeks.append((partition, offset))
        real_seek(partition, offset)

    monkeypatch.setattr(broken, "commit", commit)
    monkeypatch.setattr(log, "seek", seek)
    monkeypatch.setattr("evsched.runtime.replica.RETRY_FIRST_S", 0.0)
    task = replica.follow(log)
    for _ in range(200):
        await asyncio.sleep(0.01)
        if replica.index(0).applied_offset() == 0 and not replica.failing:
            break
    assert not task.done()  # the loop lives on
    assert replica.index(1).job("y") is not None  # the other partition was never held back
    assert seeks == [(0, 0), (1, 0), (0, 0)]  # p0 read again from its index after the failure
    job = replica.index(0).job("x")
    assert job is not None and job.status is Status.SCHEDULED  # retried: folded this time
    assert replica.failing == {}
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    for projector in replica.projectors.values():
        projector.index.close()


class FailingFetches:
    """A started consumer whose first fetch fails; the second stops the node."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop_event = stop
        self.fetches = 0
        self.stopped = False

    async def read_all(self, timeout_s: float, max_records: int) -> dict[int, list[Record]]:
        self.fetches += 1
        if self.fetches == 1:
            raise BrokerUnavailable("broker went away")
        self.stop_event.set()
        return {}

    def assignment(self) -> set[int]:
        return set()

    async def close(self) -> None:
        self.stopped = True


async def test_a_failed_fetch_does_not_end_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stop = asyncio.Event()
    consumer = FailingFetches(stop)
    node = Node(NodeConfig(settings=Settings(namespace="ns"), node_id="n", data_dir=tmp_path))

    async def start() -> FailingFetches:
        return consumer

    monkeypatch.setattr(node, "_start_consumer", start)
    monkeypatch.setattr("evsched.runtime.node.node.POLL_RETRY_S", 0.01)
    await asyncio.wait_for(node.run(stop), 10)
    assert consumer.fetches == 2 and consumer.stopped


async def test_jobs_held_back_at_the_head_of_the_due_index_hide_no_later_job(
    tmp_path: Path,
) -> None:
    # Jobs on an undeclared queue stay scheduled and due; with the scan's window full of them,
    # a job due after them was never seen again.
    async def ghost_undeclared(queues: set[str]) -> Mapping[str, Unusable]:
        return {q: Unusable(stage="undeclared", reason="no topic") for q in queues if q == "ghost"}

    box = outbox()
    owner = await owned(tmp_path, box, scan_limit=2)
    owner.ensure_queues = ghost_undeclared
    later = JobEnqueued(
        event_id="e-d", job_id="d", emitted_at=0, source="t", task="t", queue="default",
        args=b"[]", run_at=5_000,
    )  # fmt: skip
    ghosts = [enqueued(o, f"g{o}", "ghost") for o in range(3)]
    later_record = Record(TOPICS.events, 0, 3, 1_000, b"d", avro.encode_event(later))
    await owner.step([*ghosts, later_record], 2_000, 4)
    assert all(owner.quarantine.holds(f"g{o}") for o in range(3))
    await owner.step([], 6_000, 4)  # d is due now; the ghosts are still held back
    leased = {avro.decode_event(v).job_id for t, v in committed(box) if t == TOPICS.events}
    assert leased == {"d"}
    owner.close()


def test_a_hold_that_ends_after_the_plan_looked_wakes_the_partition_at_once() -> None:
    # The plan skipped a job still held; by the time the wake is computed its hold has ended.
    # Released silently with no wake, it waited for a record that may never come (it did, on
    # an undeclared queue: the job was never planned again).
    clock = FrozenClock(mono_s=100.0)
    quarantine = Quarantine(partition=0, clock=clock)
    quarantine.add("job", "undeclared", "queue 'q' is not declared", hold_s=2.0, quiet=True)
    assert quarantine.holds("job")  # what the plan saw
    assert quarantine.first_release_ms(5_000) == 7_000
    clock.advance(2.001)
    assert quarantine.first_release_ms(5_000) == 5_000  # now, not None
    assert quarantine.first_release_ms(5_000) is None  # nothing left to wait for
    assert not quarantine.holds("job")
