"""A job of a queue no worker serves is not leased (nothing goes to the log while it waits), and
is leased once a worker of its queue is seen; presence that cannot be told fails open."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from evsched.adapters import avro
from evsched.core.events import JobEnqueued, JobLeased, LeaseExpired
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status
from evsched.runtime.node.metrics import NodeMetrics
from evsched.runtime.partition.presence import WorkerPresence
from evsched.runtime.partition.quarantine import QUARANTINE_S, Unusable
from evsched.testing import FrozenClock, MemoryPools, NodeDriver
from tests.unit.node_driver_events import enqueued, started

BUDGETS = PlannerBudgets(dispatch_timeout_ms=5_000, prelease_ms=0)
POOL = "ns.workers.default"


class Logged:
    """A structlog stand-in that keeps the events logged."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def warning(self, event: str, **fields: Any) -> None:
        self.events.append(("warning", event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self.events.append(("info", event, fields))


@pytest.fixture
def pools() -> MemoryPools:
    return MemoryPools()


@pytest.fixture
def driver(tmp_path: Path, pools: MemoryPools) -> Iterator[NodeDriver]:
    clock = FrozenClock()
    presence = WorkerPresence(pools, clock, logger=Logged())
    node = NodeDriver(tmp_path, budgets=BUDGETS, clock=clock, presence=presence)
    yield node
    node.close()


def presence_of(driver: NodeDriver) -> WorkerPresence:
    assert driver.presence is not None
    return driver.presence


async def woken_by_presence(driver: NodeDriver) -> WorkerPresence:
    presence = presence_of(driver)
    owner = await driver.open()
    presence.on_gain = owner.wake  # the node wakes every partition it owns
    await presence.refresh()
    return presence


async def test_a_job_waits_for_a_worker_without_a_lease_then_is_leased_when_one_is_seen(
    driver: NodeDriver, pools: MemoryPools
) -> None:
    presence = await woken_by_presence(driver)
    driver.append(enqueued("a"))
    await driver.settle()
    for _ in range(3):  # three dispatch timeouts: nothing is proposed, nothing expires
        driver.advance(5)
        await driver.settle()
    assert driver.decisions() == [] and driver.dispatched() == []
    logged = [avro.decode_event(r.value) for r in driver.log() if r.value is not None]
    assert [type(event) for event in logged] == [JobEnqueued]  # the enqueue, nothing since
    state = driver.job("a")
    assert state is not None and state.status is Status.SCHEDULED
    assert presence.waiting() == {"default"} and presence.workers() == {}
    assert driver.owner.next_wake_at() is None  # a held job wakes nothing by itself
    pools.serve(POOL, "default")
    await presence.refresh()  # the look-up that sees the worker wakes the partition
    assert driver.owner.has_work([], driver.clock.now_ms())
    await driver.settle()
    [lease] = driver.decisions(JobLeased)
    assert lease.job_id == "a" and lease.token == 1
    assert [d.job_id for d in driver.dispatched("default")] == ["a"]
    assert presence.waiting() == set() and presence.workers() == {"default": 1}


async def test_the_first_look_up_is_waited_for_and_without_look_ups_every_queue_is_leased(
    driver: NodeDriver, pools: MemoryPools
) -> None:
    presence = presence_of(driver)
    assert presence.staffed() is None  # nothing looks up (no run): never stall work on it
    stop = asyncio.Event()
    loop = asyncio.create_task(presence.run(stop))
    try:
        await asyncio.sleep(0)
        # A running node's first look-up is on its way: a restart over waiting jobs holds them
        # for its few milliseconds instead of leasing every one once.
        assert presence.staffed() == set()
        driver.append(enqueued("a"))
        await driver.settle()
        assert driver.decisions() == [] and presence.waiting() == {"default"}

        async def answered() -> None:
            while presence.staffed() is not None and pools.asks == 0:
                await asyncio.sleep(0.001)

        await asyncio.wait_for(answered(), timeout=10)
        assert presence.staffed() == set() and not presence.failing
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=10)


async def test_jobs_of_a_queue_without_worker_do_not_hide_the_jobs_of_a_served_one(
    tmp_path: Path, pools: MemoryPools
) -> None:
    clock = FrozenClock()
    presence = WorkerPresence(pools, clock, logger=Logged())
    driver = NodeDriver(tmp_path, budgets=BUDGETS, clock=clock, presence=presence, scan_limit=2)
    try:
        await woken_by_presence(driver)
        earlier = clock.now_ms() - 1_000
        driver.append(*(enqueued(f"idle-{i}", queue="idle", run_at=earlier) for i in range(5)))
        driver.append(enqueued("b", queue="served"))
        await driver.settle()
        assert driver.decisions() == []
        pools.serve(POOL, "served")
        await presence.refresh()  # b is read from the index now, behind five earlier idle jobs
        await driver.settle()
        assert [lease.job_id for lease in driver.decisions(JobLeased)] == ["b"]
        assert presence.waiting() == {"idle"}
    finally:
        driver.close()


async def test_a_worker_that_left_gets_no_new_lease_and_its_lease_still_expires(
    driver: NodeDriver, pools: MemoryPools
) -> None:
    pools.serve(POOL, "default")
    presence = await woken_by_presence(driver)
    driver.append(enqueued("a"), enqueued("b"))
    await driver.settle()
    first = {d.job_id: d for d in driver.dispatched("default")}
    assert sorted(first) == ["a", "b"]
    driver.append(started(first["a"]))  # a runs; b's worker died before starting it
    await driver.settle()
    pools.rebalancing(POOL)  # the dead member's session runs out: the pool rebalances
    await presence.refresh()
    assert presence.workers() == {"default": 1}  # as when last stable
    pools.leave(POOL)
    await presence.refresh()
    assert presence.workers() == {}
    driver.advance(10)  # past both leases' ends (dispatch 5 s, run lease 10 s)
    await driver.settle()
    expired = sorted(e.job_id for e in driver.decisions(LeaseExpired))
    assert expired == ["a", "b"]  # leases held when the workers went expire as always
    assert len(driver.decisions(JobLeased)) == 2  # and nothing is leased again meanwhile
    assert presence.waiting() == {"default"}


async def test_presence_that_cannot_be_told_fails_open_and_is_logged_once(
    tmp_path: Path, pools: MemoryPools
) -> None:
    clock, logged = FrozenClock(), Logged()
    presence = WorkerPresence(pools, clock, logger=logged)
    driver = NodeDriver(tmp_path, budgets=BUDGETS, clock=clock, presence=presence)
    try:
        await woken_by_presence(driver)
        driver.append(enqueued("a"))
        await driver.settle()
        assert driver.decisions() == []
        pools.failing = True  # e.g. no Describe on the workers' groups
        await presence.refresh()  # unknown: the partition is woken and leases as before
        await presence.refresh()
        await driver.settle()
        assert [lease.job_id for lease in driver.decisions(JobLeased)] == ["a"]
        assert presence.staffed() is None and presence.failing
        assert [(level, event) for level, event, _ in logged.events] == [
            ("info", "worker_presence_known"),  # the first answer
            ("warning", "worker_presence_unknown"),  # once, however many look-ups fail
        ]
        pools.failing = False
        await presence.refresh()
        assert logged.events[-1][:2] == ("info", "worker_presence_known")
        assert presence.staffed() == set()
    finally:
        driver.close()


async def test_a_held_queue_whose_topic_is_unusable_is_planned_and_checked_once_per_hold(
    tmp_path: Path, pools: MemoryPools
) -> None:
    clock = FrozenClock()
    broken = {"bad": Unusable(stage="topic", reason="partitions=1, not 3")}
    checks: list[set[str]] = []  # what the presence asked (the partition's sends ask too)

    async def ensure(queues: set[str]) -> Mapping[str, Unusable]:
        return {q: broken[q] for q in queues if q in broken}

    async def checked(queues: set[str]) -> Mapping[str, Unusable]:
        checks.append(set(queues))
        return await ensure(queues)

    presence = WorkerPresence(pools, clock, logger=Logged(), ensure_queues=checked)
    driver = NodeDriver(
        tmp_path, budgets=BUDGETS, clock=clock, presence=presence, ensure_queues=ensure
    )
    try:
        await woken_by_presence(driver)
        driver.append(enqueued("a", queue="bad"))
        await driver.settle()
        assert presence.waiting() == {"bad"}  # no worker: held
        await presence.refresh()  # its check: unusable, so it is planned as before presence
        assert checks == [{"bad"}] and presence.staffed() == {"bad"}
        await driver.settle()
        assert driver.decisions() == [] and driver.owner.quarantine.holds("a")
        await presence.refresh()  # within the hold of its decisions: not asked again
        assert checks == [{"bad"}]
        clock.advance(QUARANTINE_S)
        await presence.refresh()
        assert checks == [{"bad"}, {"bad"}] and presence.staffed() == {"bad"}
        broken.clear()  # repaired; still no worker: held again once its next check passes
        clock.advance(QUARANTINE_S)
        await presence.refresh()
        assert checks[-1] == {"bad"} and presence.staffed() == set()
    finally:
        driver.close()


async def test_look_ups_run_only_while_partitions_plan_or_hold_jobs(pools: MemoryPools) -> None:
    clock = FrozenClock()
    presence = WorkerPresence(pools, clock, logger=Logged(), refresh_s=0.001, demand_s=10)
    stop = asyncio.Event()
    loop = asyncio.create_task(presence.run(stop))
    for _ in range(20):
        await asyncio.sleep(0)
    assert pools.asks == 0  # nobody asked: no look-up
    presence.staffed()  # a partition plans: look up at once, and again while it keeps asking

    async def asked(times: int) -> None:
        while pools.asks < times:
            await asyncio.sleep(0.001)

    await asyncio.wait_for(asked(3), timeout=10)
    clock.advance(11)  # nobody asked for longer than demand_s and no job is held: idle
    await asyncio.sleep(0.01)
    idle = pools.asks
    await asyncio.sleep(0.05)
    assert pools.asks == idle
    presence.staffed()
    presence.held(0, {"default"})  # a held job keeps the look-ups going, asked or not
    clock.advance(11)
    now = pools.asks
    await asyncio.wait_for(asked(now + 2), timeout=10)
    presence.forget(0)  # the partition was revoked: idle again
    await asyncio.sleep(0.01)
    idle = pools.asks
    await asyncio.sleep(0.05)
    assert pools.asks == idle
    stop.set()
    await asyncio.wait_for(loop, timeout=10)


async def test_the_node_gauges_show_a_queue_waiting_for_workers(
    driver: NodeDriver, pools: MemoryPools
) -> None:
    metrics = NodeMetrics.create()
    presence = await woken_by_presence(driver)
    metrics.watch_presence(presence.waiting, presence.workers)
    registry = metrics.folded.registry

    def sample(name: str, queue: str) -> float | None:
        return registry.get_sample_value(name, {"queue": queue})

    driver.append(enqueued("a", queue="mail"))
    await driver.settle()
    # No lease ever expires for it, yet the alert's gauge says the queue has no worker.
    assert sample("evsched_queue_without_worker", "mail") == 1
    assert sample("evsched_queue_workers", "mail") == 0
    pools.serve(POOL, "mail")
    pools.serve(POOL, "mail")
    await presence.refresh()
    await driver.settle()
    assert sample("evsched_queue_without_worker", "mail") == 0
    assert sample("evsched_queue_workers", "mail") == 2
