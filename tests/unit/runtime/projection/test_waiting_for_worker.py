"""Jobs whose leases expire before any start wait for a worker: the gauges and the audit say so."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from evsched.core.events import LeaseExpired
from evsched.operator.audit import audit
from evsched.runtime.projection.waiting import WITHOUT_WORKER_AFTER, WaitingForWorker
from evsched.testing import MemoryPartitionLog, NodeDriver
from tests.unit.node_driver_events import enqueued, started, succeeded
from tests.unit.runtime.node.test_node_lifecycle import node_over


def sample(registry: CollectorRegistry, name: str, queue: str) -> float | None:
    return registry.get_sample_value(name, {"queue": queue})


async def test_a_queue_without_worker_is_told_apart_from_a_slow_one(driver: NodeDriver) -> None:
    registry = CollectorRegistry()
    waiting = WaitingForWorker(registry)
    await driver.open()
    driver.owner.projector.on_commit = waiting.observe
    driver.append(enqueued("a", queue="mail", max_attempts=1), enqueued("b", queue="mail"))
    await driver.settle()
    assert sample(registry, "evsched_jobs_waiting_for_worker", "mail") is None  # never waited
    for expiries in (1, 2, 3):
        driver.advance(30)
        await driver.settle()
        assert len(driver.decisions(LeaseExpired)) == 2 * expiries
        assert sample(registry, "evsched_jobs_waiting_for_worker", "mail") == 2
        assert sample(registry, "evsched_queue_unstarted_expiries", "mail") == 2 * expiries
        assert sample(registry, "evsched_queue_without_worker", "mail") == 1
    # A worker comes: one start clears the queue's streak; the job it took no longer waits.
    dispatch = driver.dispatched("mail")[-2]
    driver.append(started(dispatch))
    await driver.settle()
    assert sample(registry, "evsched_queue_without_worker", "mail") == 0
    assert sample(registry, "evsched_jobs_waiting_for_worker", "mail") == 1
    driver.append(succeeded(dispatch))
    await driver.settle()
    assert waiting.without_worker() == {"mail": False}
    # The audit of the other job says it waits for a worker, not that it failed.
    other = "b" if dispatch.job_id == "a" else "a"
    found = audit(driver.owner.index, other)
    assert found is not None
    readings = [r.reading for r in found.rows if r.entry.kind == "LeaseExpired"]
    assert readings[-1].endswith(
        "waiting for a worker: 3 leases expired unstarted (no attempt spent)"
    )
    assert "1 lease expired unstarted" in readings[0]


def test_a_job_that_ends_stops_waiting() -> None:
    waiting = WaitingForWorker(threshold=1)
    assert waiting.waiting() == {} and waiting.without_worker() == {}


async def test_a_revoked_partitions_jobs_stop_waiting_on_this_node(
    driver: NodeDriver, tmp_path: Path
) -> None:
    """Their starts and ends are folded by the partition's new owner now, never here."""
    node, _, _ = node_over(tmp_path / "node", MemoryPartitionLog(), committed=None)
    assert node.metrics is not None
    registry = node.metrics.folded.registry
    await driver.open()
    driver.owner.projector.on_commit = node.metrics.waiting.observe
    driver.append(enqueued("a", queue="mail"))
    await driver.settle()
    for _ in range(WITHOUT_WORKER_AFTER):
        driver.advance(30)
        await driver.settle()
    assert sample(registry, "evsched_queue_without_worker", "mail") == 1
    await node.revoke([driver.partition + 1])  # another partition's: still waits here
    assert sample(registry, "evsched_jobs_waiting_for_worker", "mail") == 1
    await node.revoke([driver.partition])
    assert sample(registry, "evsched_jobs_waiting_for_worker", "mail") == 0
    assert sample(registry, "evsched_queue_without_worker", "mail") == 0
