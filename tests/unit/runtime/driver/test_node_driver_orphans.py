"""A node's index keeps rejected events of jobs it does not hold only for a while (fold version 6):
a late completion after a purge goes with the purge's mark, a forged event for an id never
enqueued after ``retention.ORPHAN_KEPT_MS`` of log time; the audit reads both, the changelog
restores the same index, and a rebuild at any batch size gives the same digest."""

from __future__ import annotations

from pathlib import Path

from evsched.adapters.index.keys import FOLLOWERS, ORPHANS
from evsched.adapters.index.store import PartitionIndex
from evsched.core import retention
from evsched.core.events import JobCancelled
from evsched.core.state import Verdict
from evsched.operator.audit import audit
from evsched.operator.render import audit_json
from evsched.runtime.projection.changelog import restore_into
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import succeeded
from tests.unit.runtime.driver.test_node_driver_retention import (
    enqueue,
    rebuilt_digest,
    run_to_success,
)

DAY_S = 86_400


def forged_cancel(job_id: str, n: int) -> JobCancelled:
    return JobCancelled(event_id=f"forged-c{n}", job_id=job_id, emitted_at=0, source="mallory")


def count(driver: NodeDriver, family: str) -> int:
    return sum(1 for _ in driver.owner.index.scan(family))


async def test_a_late_completion_after_a_purge_goes_with_the_purge_mark(
    driver: NodeDriver, tmp_path: Path
) -> None:
    driver.append(enqueue("a"))
    await run_to_success(driver, "a")
    [dispatch] = [d for d in driver.dispatched() if d.job_id == "a"]
    driver.advance(61)  # a's retention (a minute) ends: purged, its mark kept for a minute
    await driver.settle()
    assert [e.kind for e in driver.job_timeline("a")] == ["JobPurged"]
    driver.append(succeeded(dispatch), forged_cancel("ghost", 1))  # late; never enqueued
    await driver.settle()

    timeline = driver.job_timeline("a")
    assert [(e.kind, e.verdict) for e in timeline] == [
        ("JobPurged", Verdict.APPLIED),
        ("AttemptSucceeded", Verdict.REJECTED),
    ]
    found = audit(driver.owner.index, "a")
    assert found is not None and not found.drifted
    assert "no such job" in found.rows[-1].reading and "events log" in found.rows[-1].reading
    assert audit_json(found)["events"][-1]["verdict"] == "rejected"
    assert (count(driver, FOLLOWERS), count(driver, ORPHANS)) == (1, 1)

    driver.append(enqueue("b"))
    await run_to_success(driver, "b")
    driver.advance(61)  # b's purge comes after a's mark time: a's mark and its follower go
    await driver.settle()

    assert driver.job_timeline("a") == [] and driver.job("b") is None
    assert [e.kind for e in driver.job_timeline("ghost")] == ["JobCancelled"]  # for 7 days
    assert (count(driver, FOLLOWERS), count(driver, ORPHANS)) == (0, 1)
    await _same_everywhere(driver, tmp_path / "1")


async def test_a_forged_event_for_an_unknown_id_expires_after_the_default_retention(
    driver: NodeDriver, tmp_path: Path
) -> None:
    driver.append(forged_cancel("ghost", 2))
    await driver.settle()
    forged_at = driver.log()[-1].log_at
    kept_until = retention.orphan_until(forged_at)
    driver.append(enqueue("c", retention_ms=0))
    await run_to_success(driver, "c")  # purged at once: before the ghost's time
    driver.advance(retention.ORPHAN_KEPT_MS / 1000 - 1)
    driver.append(enqueue("d", retention_ms=0))
    await run_to_success(driver, "d")
    assert driver.log()[-1].log_at < kept_until
    assert [e.kind for e in driver.job_timeline("ghost")] == ["JobCancelled"]

    driver.advance(1)
    driver.append(enqueue("e", retention_ms=0))
    await run_to_success(driver, "e")  # the first purge from the ghost's time on

    assert driver.log()[-1].log_at >= kept_until
    assert driver.job_timeline("ghost") == []
    assert count(driver, ORPHANS) == 0
    assert audit(driver.owner.index, "ghost") is None  # the CLI then points at the log
    await _same_everywhere(driver, tmp_path / "2")
    assert DAY_S * 7 * 1000 == retention.ORPHAN_KEPT_MS


async def _same_everywhere(driver: NodeDriver, scratch: Path) -> None:
    """A rebuild at batch sizes 1, 4 and 1000 and a restore from the changelog equal the index."""
    live = driver.owner.index.digest()
    for batch in (1, 4, 1000):
        assert rebuilt_digest(driver, scratch / f"rebuilt-{batch}", batch=batch) == live
    restored = PartitionIndex(scratch / "restored", driver.partition)
    try:
        await restore_into(driver.broker.reader(driver.topics.state), driver.partition, restored)
        assert restored.digest() == live
    finally:
        restored.close()
