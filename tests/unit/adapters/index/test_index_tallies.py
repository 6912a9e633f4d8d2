"""The index's lifetime tallies through NodeDriver: counted from the fold's verdicts in the batch
that carries the applied offset, kept when retention purges the jobs, equal after a rebuild
however the log is batched, carried by a changelog restore and by a crash's refold."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from rocksdict import Options, Rdict

from evsched.adapters.index.keys import U64
from evsched.adapters.index.readonly import ReadOnlyIndex
from evsched.adapters.index.store import COLUMN_FAMILIES, META, PartitionIndex
from evsched.adapters.index.store import FOLD_VERSION as VERSION_KEY
from evsched.adapters.index.tallies import TALLIES
from evsched.core import tallies
from evsched.core.events import JobCancelled, JobEnqueued, JobPurged, LeaseExpired
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Status
from evsched.runtime.projection.changelog import restore_into
from evsched.runtime.projection.projector import Projector
from evsched.testing import NodeDriver, SimulatedCrash
from tests.unit.node_driver_events import enqueued, failed, started, succeeded

MINUTE_MS = 60_000
EXPECTED = {
    tallies.RETRIES: 1,
    tallies.DEAD_LETTERS: 1,
    tallies.STALE_COMPLETIONS: 1,
    tallies.LEASE_EXPIRATIONS: 1,
    tallies.SUCCEEDED: 2,
    tallies.CANCELLED: 1,
    tallies.UNDECODABLE: 1,
}


def enqueue(job_id: str, **fields: object) -> JobEnqueued:
    return replace(enqueued(job_id, **fields), retention_ms=MINUTE_MS)  # type: ignore[arg-type]


def cancel(job_id: str) -> JobCancelled:
    return JobCancelled(event_id=f"cancel-{job_id}", job_id=job_id, emitted_at=0, source="client")


async def run_history(driver: NodeDriver) -> None:
    """One of each tally: a retry then a success (a), a lease that expires, whose worker's late
    success is stale, then a success (b), a permanent failure (c), a cancel (d), bad bytes."""
    driver.append(enqueue("a"), enqueue("b", max_attempts=2), enqueue("c"))
    driver.append(enqueue("d", run_at=10**13))
    await driver.settle()
    first = {d.job_id: d for d in driver.dispatched()}
    a, b, c = first["a"], first["b"], first["c"]
    driver.append(started(a), failed(a))
    driver.append(started(b, lease_ms=10_000))
    driver.append(started(c), failed(c, retryable=False))
    driver.append(cancel("d"))
    driver.append_raw(b"\x00garbage")
    await driver.settle()
    driver.advance(10)  # b's lease ends; a's retry is due
    await driver.settle()
    assert [e.job_id for e in driver.decisions(LeaseExpired)] == ["b"]
    driver.append(succeeded(b))  # the silent worker's late report
    driver.advance(1)  # b's retry is due
    await driver.settle()
    last = {d.job_id: d for d in driver.dispatched()}
    assert (last["a"].token, last["b"].token) == (2, 2)
    driver.append(started(last["a"]), succeeded(last["a"]))
    driver.append(started(last["b"]), succeeded(last["b"]))
    await driver.settle()
    states = driver.jobs("abcd")
    assert {k: s.status for k, s in states.items() if s is not None} == {
        "a": Status.SUCCEEDED,
        "b": Status.SUCCEEDED,
        "c": Status.DEAD,
        "d": Status.CANCELLED,
    }


def refolded(driver: NodeDriver, path: Path, *, batch: int) -> PartitionIndex:
    """A fresh index folding the driver's whole log, ``batch`` records at a time (as a rebuild)."""
    index = PartitionIndex(path, driver.partition)
    projector = Projector(index)
    log = driver.log()
    for start in range(0, len(log), batch):
        projector.commit(projector.fold(log[start : start + batch]))
    return index


async def test_the_index_counts_each_tally_from_the_folds_verdicts(driver: NodeDriver) -> None:
    await run_history(driver)
    assert driver.owner.index.tallies() == EXPECTED


async def test_purges_do_not_lower_the_tallies_and_a_rebuild_reproduces_them(
    driver: NodeDriver, tmp_path: Path
) -> None:
    await run_history(driver)
    driver.advance(61)  # every finished job's retention ends
    await driver.settle()
    assert sorted(p.job_id for p in driver.decisions(JobPurged)) == ["a", "b", "c", "d"]
    index = driver.owner.index
    assert list(index.jobs()) == []
    assert index.tallies() == EXPECTED
    for batch in (1, 4, 1_000):
        rebuilt = refolded(driver, tmp_path / f"rebuilt-{batch}", batch=batch)
        try:
            assert rebuilt.tallies() == EXPECTED
            assert rebuilt.digest() == index.digest()
        finally:
            rebuilt.close()


async def test_the_digest_covers_the_tallies(driver: NodeDriver, tmp_path: Path) -> None:
    await run_history(driver)
    other = refolded(driver, tmp_path / "other", batch=1_000)
    try:
        assert other.digest() == driver.owner.index.digest()
        # One retry more, and nothing else different.
        other._cf[TALLIES][tallies.RETRIES.encode()] = U64.pack(EXPECTED[tallies.RETRIES] + 1)
        assert other.tallies()[tallies.RETRIES] == EXPECTED[tallies.RETRIES] + 1
        assert other.digest() != driver.owner.index.digest()
    finally:
        other.close()


async def test_a_changelog_restore_carries_the_tallies(driver: NodeDriver, tmp_path: Path) -> None:
    await run_history(driver)
    driver.advance(61)
    await driver.settle()  # purges too: their tombstones must not touch the tallies
    index = PartitionIndex(tmp_path / "restored", driver.partition)
    try:
        log = driver.broker.reader(driver.topics.state)
        meta = await restore_into(log, driver.partition, index)
        assert meta is not None and meta.applied_offset == driver.owner.index.applied_offset()
        assert index.tallies() == EXPECTED
        assert index.digest() == driver.owner.index.digest()
    finally:
        index.close()


async def test_a_batch_refolded_after_a_crash_is_counted_once(driver: NodeDriver) -> None:
    await run_history(driver)
    # "g" is leased: the batch's step sends a transaction (a step that sends nothing writes its
    # index without one, and its changelog goes with a later step's).
    driver.append(cancel("e"), enqueue("f"), cancel("f"), enqueue("g"))
    driver.crash_after_commit()
    with pytest.raises(SimulatedCrash):
        await driver.settle()
    assert driver.owner.index.tallies() == EXPECTED  # the index was not written
    await driver.restart()
    await driver.settle()
    assert driver.owner.index.tallies() == {**EXPECTED, tallies.CANCELLED: 2}


def test_an_index_from_before_the_tallies_reads_as_empty_read_only(tmp_path: Path) -> None:
    """A node of fold version 4 made no ``tallies`` family: ``rebuild --verify`` still reads its
    index (and finds it of another fold version) instead of failing to open it."""
    path = tmp_path / "p0000"
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    older = [name for name in COLUMN_FAMILIES if name != TALLIES]
    db = Rdict(str(path), options, column_families={name: Options(raw_mode=True) for name in older})
    db.get_column_family(META)[VERSION_KEY] = U64.pack(FOLD_VERSION - 1)
    db.close()
    del db
    index = ReadOnlyIndex(path, 0)
    try:
        assert index.fold_version() == FOLD_VERSION - 1
        assert index.tallies() == {}
        assert len(index.digest()) == 64
    finally:
        index.close()
