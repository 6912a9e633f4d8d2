"""Retention through NodeDriver: purges decided by the node and judged by the fold, purge marks
that expire from the log, the idempotency key window's new runs, and forged purges refused."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

from evsched.adapters.index.store import PartitionIndex
from evsched.core.events import JobCancelled, JobEnqueued, JobLeased, JobPurged
from evsched.core.ids import job_id_for_key
from evsched.core.state import Status, Verdict
from evsched.operator.audit import audit
from evsched.operator.render import audit_json
from evsched.runtime.projection.projector import Projector
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import enqueued, started, succeeded

_ids = itertools.count()
MINUTE_MS = 60_000


def enqueue(job_id: str, **fields: object) -> JobEnqueued:
    return replace(enqueued(job_id), **{"retention_ms": MINUTE_MS, **fields})  # type: ignore[arg-type]


def keyed(key: str, args: bytes = b"[]", **fields: object) -> JobEnqueued:
    return enqueue(job_id_for_key("default", key), idempotency_key=key, args=args, **fields)


def purge(job_id: str, generation: int = 0) -> JobPurged:
    return JobPurged(
        event_id=f"forged-{next(_ids)}", job_id=job_id, emitted_at=0, source="mallory",
        generation=generation,
    )  # fmt: skip


async def run_to_success(driver: NodeDriver, job_id: str) -> None:
    await driver.settle()
    [dispatch] = [d for d in driver.dispatched() if d.job_id == job_id][-1:]
    driver.append(started(dispatch), succeeded(dispatch))
    await driver.settle()
    last = driver.job_timeline(job_id)[-1]  # the success, or the purge right after it
    assert last.kind in ("AttemptSucceeded", "JobPurged") and last.verdict is Verdict.APPLIED


def rebuilt_digest(driver: NodeDriver, path: Path, *, batch: int) -> str:
    """The digest of a fresh index folding the driver's whole log, ``batch`` records at a time."""
    index = PartitionIndex(path, driver.partition)
    projector = Projector(index)
    log = driver.log()
    for start in range(0, len(log), batch):
        projector.commit(projector.fold(log[start : start + batch]))
    digest = index.digest()
    index.close()
    return digest


async def test_a_finished_job_is_purged_when_its_retention_ends_in_log_time(
    driver: NodeDriver, tmp_path: Path
) -> None:
    driver.append(enqueue("a"))
    await run_to_success(driver, "a")
    ended = driver.log()[-1].log_at
    driver.advance(59.999)
    await driver.settle()
    assert driver.decisions(JobPurged) == []
    driver.advance(0.001)
    await driver.settle()

    [decision] = driver.decisions(JobPurged)
    assert (decision.job_id, decision.generation) == ("a", 0)
    assert driver.log()[-1].log_at >= ended + MINUTE_MS
    assert driver.job("a") is None
    [mark] = driver.job_timeline("a")  # what stays behind: the purge itself
    assert (mark.kind, mark.verdict) == ("JobPurged", Verdict.APPLIED)
    assert "partition 0 offset 0" in mark.reason
    assert await driver.settle() == 0  # folded back: not proposed again
    index = driver.owner.index
    for batch in (1, 3, 1000):
        assert rebuilt_digest(driver, tmp_path / f"rebuilt-{batch}", batch=batch) == index.digest()


async def test_purge_marks_expire_at_a_later_purge_so_the_index_stays_flat(
    driver: NodeDriver, tmp_path: Path
) -> None:
    for n in range(3):
        driver.append(enqueue(f"j{n}"))
        await run_to_success(driver, f"j{n}")
        driver.advance(61)  # each job's retention ends, and so does the mark of the one before
        await driver.settle()

    assert [driver.job(f"j{n}") for n in range(3)] == [None, None, None]
    assert driver.job_timeline("j0") == []  # its mark expired at j1's purge
    assert driver.job_timeline("j1") == []
    assert [e.kind for e in driver.job_timeline("j2")] == ["JobPurged"]
    index = driver.owner.index
    assert list(index.jobs()) == []
    for batch in (1, 2, 1000):
        assert rebuilt_digest(driver, tmp_path / f"rebuilt-{batch}", batch=batch) == index.digest()


async def test_forged_purges_are_rejected_with_a_reason(driver: NodeDriver) -> None:
    driver.append(enqueue("busy"), enqueue("done"))
    await driver.settle()
    done = next(d for d in driver.dispatched() if d.job_id == "done")
    driver.append(started(done), succeeded(done))
    await driver.settle()
    driver.append(purge("busy"), purge("nobody"), purge("done"), purge("done", generation=1))
    await driver.settle()

    reasons = {
        job: [e.reason for e in driver.job_timeline(job) if e.kind == "JobPurged"]
        for job in ("busy", "done")
    }
    assert reasons["busy"] == ["cannot purge: job is leased"]
    assert reasons["done"][0].startswith("cannot purge before its retention ends at")
    assert reasons["done"][1] == "cannot purge run 1: the job is at run 0"
    verdicts = {e.verdict for job in ("busy", "done") for e in driver.job_timeline(job)[-2:]}
    assert Verdict.APPLIED not in verdicts - {Verdict.APPLIED} and driver.job("done") is not None
    assert [e.reason for e in driver.job_timeline("nobody")] == ["unknown job"]
    assert driver.job("busy") is not None


async def test_a_key_reused_within_its_window_is_a_duplicate_and_after_it_a_new_run(
    driver: NodeDriver,
) -> None:
    first = keyed("k", key_window_ms=10_000)
    job_id = first.job_id
    driver.append(first)
    await run_to_success(driver, job_id)
    token = driver.job(job_id).token  # type: ignore[union-attr]
    driver.append(keyed("k", key_window_ms=10_000))
    await driver.settle()
    assert driver.job_timeline(job_id)[-1].verdict is Verdict.DUPLICATE

    driver.advance(10)
    driver.append(keyed("k", args=b"[1]", key_window_ms=10_000))
    await driver.settle()

    state = driver.job(job_id)
    assert state is not None and state.generation == 1 and state.args == b"[1]"
    assert state.status is Status.LEASED and state.attempt == 1 and state.token == token + 1
    assert "run 1" in [e for e in driver.job_timeline(job_id) if e.kind == "JobEnqueued"][-1].reason
    leases = driver.decisions(JobLeased)
    assert [lease.token for lease in leases] == [token, token + 1]  # fencing holds across runs


async def test_a_purge_of_an_earlier_run_is_rejected(driver: NodeDriver) -> None:
    first = keyed("again", key_window_ms=0)
    driver.append(first, JobCancelled(event_id="c1", job_id=first.job_id, emitted_at=0, source="x"))
    await driver.settle()
    driver.append(keyed("again", key_window_ms=0, args=b"[2]"))
    await driver.settle()
    driver.advance(120)
    driver.append(purge(first.job_id, generation=0))
    await driver.settle()

    entries = [e for e in driver.job_timeline(first.job_id) if e.source == "mallory"]
    assert entries[0].reason == "cannot purge run 0: the job is at run 1"


async def test_an_id_enqueued_again_after_its_purge_is_a_new_job(
    driver: NodeDriver, tmp_path: Path
) -> None:
    driver.append(enqueue("re", retention_ms=0))
    await run_to_success(driver, "re")
    assert driver.job("re") is None  # a retention of 0: purged at once
    driver.append(enqueue("re", args=b"[3]"))
    await driver.settle()

    state = driver.job("re")
    assert state is not None and state.generation == 0 and state.args == b"[3]"
    kinds = [e.kind for e in driver.job_timeline("re")]
    assert kinds[:2] == ["JobPurged", "JobEnqueued"]  # the audit still shows the purge
    index = driver.owner.index
    for batch in (1, 1000):
        assert rebuilt_digest(driver, tmp_path / f"rebuilt-{batch}", batch=batch) == index.digest()


async def test_the_audit_of_a_purged_job_says_when_where_and_where_its_history_is(
    driver: NodeDriver,
) -> None:
    driver.append(enqueue("before"), enqueue("gone"))
    await run_to_success(driver, "gone")
    driver.advance(61)
    await driver.settle()

    found = audit(driver.owner.index, "gone")
    assert found is not None and found.purged is not None and not found.drifted
    assert found.state is None
    reading = found.rows[-1].reading
    assert f"at p0@{found.purged.offset} by node-driver" in reading
    assert "history is on the events log from partition 0 offset 1" in reading
    assert audit_json(found)["purged"]["offset"] == found.purged.offset
