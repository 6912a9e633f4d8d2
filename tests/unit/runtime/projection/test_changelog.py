"""The state changelog through NodeDriver: the keys a step changes are flushed once per interval,
a job as one record (its state and timeline), each flush ending with a meta record; a restore from
it equals the node's own index (digest, derived families included), after a crash between the
commit and the index write, after one before a flush, and with purges and deletes."""

from __future__ import annotations

import shutil
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.adapters.index.keys import KEYS, job_timeline_prefix, timeline_job
from evsched.adapters.index.store import JOBS, TIMELINE, IndexBatch, PartitionIndex
from evsched.core.events import Effect
from evsched.core.fold import FOLD_VERSION
from evsched.core.planner import PlannerBudgets
from evsched.ports import Outgoing, Record
from evsched.runtime.projection import changelog as changelog_module
from evsched.runtime.projection.changelog import (
    JOB_RECORD,
    META_KEY,
    ChangelogWriter,
    Meta,
    change_key,
    decode_change,
    decode_meta,
    encode_job,
    encode_meta,
    job_changes,
    latest_meta,
    restore_into,
)
from evsched.runtime.projection.changelog_restore import Action, LocalIndex, plan_open
from evsched.testing import NodeDriver, SimulatedCrash
from tests.unit.node_driver_events import enqueued, every_minute, failed, started, succeeded
from tests.unit.runtime.driver.test_node_driver_retention import enqueue, keyed, run_to_success

BUDGETS = PlannerBudgets(dispatch_timeout_ms=30_000)


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[NodeDriver]:
    """A node flushing its changelog once a second of its clock, as a node does by default."""
    node = NodeDriver(tmp_path / "node", budgets=BUDGETS, changelog_interval_ms=None)
    yield node
    node.close()


async def _run_some_jobs(driver: NodeDriver) -> None:
    driver.append(enqueued("a"), enqueued("b"), enqueued("later", run_at=10**13))
    driver.append(every_minute("cron"), keyed("k"))
    await driver.settle()
    first, second = driver.dispatched()[:2]
    driver.append(started(first), succeeded(first, Effect(kind="mail", payload=b"x")))
    driver.append(started(second), failed(second, retryable=False))
    driver.append_raw(b"\x00garbage")
    await driver.settle()


async def _flush(driver: NodeDriver) -> None:
    """Let the flush interval pass on the driver's clock, and step."""
    driver.advance(driver.owner.changelog.interval_ms / 1000 if driver.owner.changelog else 0)
    await driver.settle()


async def _restored(driver: NodeDriver, directory: Path) -> tuple[PartitionIndex, Meta | None]:
    log = driver.broker.reader(driver.topics.state)
    index = PartitionIndex(directory, driver.partition)
    return index, await restore_into(log, driver.partition, index)


def _state_records(driver: NodeDriver) -> list[list[Record]]:
    """The changelog's records per transaction that wrote any."""
    per = [
        [r for r in t.records if r.topic == driver.topics.state] for t in driver.broker.transactions
    ]
    return [records for records in per if records]


async def test_nothing_goes_to_the_changelog_until_the_interval_passed(
    driver: NodeDriver,
) -> None:
    driver.append(enqueued("later", run_at=driver.clock.now_ms() + 60_000))
    await driver.settle()
    log = driver.broker.reader(driver.topics.state)
    assert driver.changelog() == [] and await latest_meta(log, driver.partition) is None
    assert driver.owner.changelog is not None
    assert driver.owner.changelog.deadline() == driver.clock.now_ms() + 1_000
    assert (driver.owner.next_wake_at() or 0) <= driver.clock.now_ms() + 1_000
    await _flush(driver)
    meta = await latest_meta(driver.broker.reader(driver.topics.state), driver.partition)
    assert meta == Meta(0, FOLD_VERSION) and driver.owner.index.applied_offset() == 0


async def test_each_flush_has_one_record_per_changed_job_and_ends_with_a_meta_record(
    driver: NodeDriver,
) -> None:
    await _run_some_jobs(driver)  # each job changed in several steps: one record still
    await _flush(driver)
    [flush] = _state_records(driver)
    assert flush[-1].key == META_KEY
    assert decode_meta(flush[-1].value or b"") == Meta(
        driver.owner.index.applied_offset(), FOLD_VERSION
    )
    changes = [c for r in flush if (c := decode_change(r)) is not None]
    jobs = Counter(key for family, key, _ in changes if family == JOB_RECORD)
    assert jobs == Counter({b"a": 1, b"b": 1, b"later": 1, keyed("k").job_id.encode(): 1})
    families = {family for family, _, _ in changes}
    assert {"job", "schedules", "undecodable", "tallies"} <= families
    # Derived, or inside the jobs' records: never sent on their own.
    assert not families & {"due", "leases", "cron_due", "meta", "due_priority", "jobs", KEYS}
    assert all(k[:1] != b"j" for f, k, _ in changes if f == TIMELINE)
    assert all(r.partition == driver.partition for r in flush)
    # Each job's record holds its state and its whole timeline, as the index does.
    for record in flush:
        change = decode_change(record)
        if change is not None and change[0] == JOB_RECORD and change[2] is not None:
            job_id = change[1]
            timeline = [*driver.owner.index.scan(TIMELINE, job_timeline_prefix(job_id))]
            mine = [(k, v) for k, v in timeline if k.startswith(job_timeline_prefix(job_id))]
            expected = [(JOBS, job_id, driver.owner.index.get(JOBS, job_id))]
            puts, listed = job_changes(job_id, change[2])
            assert puts == expected + [(TIMELINE, k, v) for k, v in mine]
            assert listed == {k for k, _ in mine}


async def test_a_job_changed_across_flushes_gets_a_record_in_each(driver: NodeDriver) -> None:
    driver.append(enqueued("a"))
    await driver.settle()
    await _flush(driver)
    [dispatch] = driver.dispatched()
    driver.append(started(dispatch), succeeded(dispatch))
    await driver.settle()
    await _flush(driver)
    first, second = _state_records(driver)
    for flush in (first, second):
        assert [k for r in flush if (k := decode_change(r)) and k[0] == JOB_RECORD] != []
    assert await _restored_digest(driver, driver.data_dir / "r") == driver.owner.index.digest()


async def _restored_digest(driver: NodeDriver, directory: Path) -> str:
    index, meta = await _restored(driver, directory)
    try:
        assert meta is not None and meta.applied_offset == driver.owner.index.applied_offset()
        return index.digest()
    finally:
        index.close()


async def test_a_restore_from_the_changelog_equals_the_nodes_index(
    driver: NodeDriver, tmp_path: Path
) -> None:
    await _run_some_jobs(driver)
    await _flush(driver)
    index, meta = await _restored(driver, tmp_path / "restored")
    try:
        assert meta is not None and meta.applied_offset == driver.owner.index.applied_offset()
        assert index.digest() == driver.owner.index.digest()  # due, leases, keys... derived
        assert index.next_due_at() == driver.owner.index.next_due_at()
        assert [*index.scan(KEYS)] == [*driver.owner.index.scan(KEYS)] != []
    finally:
        index.close()


async def test_a_crash_between_commit_and_index_leaves_a_whole_snapshot(
    driver: NodeDriver, tmp_path: Path
) -> None:
    await _run_some_jobs(driver)
    driver.advance(1.0)  # a flush is due: it rides in the next step's transaction
    driver.append(enqueued("c"))
    driver.crash_after_commit()
    with pytest.raises(SimulatedCrash):
        await driver.settle()
    behind = driver.owner.index.applied_offset()
    meta = await latest_meta(driver.broker.reader(driver.topics.state), driver.partition)
    # The flush was read from the index before the step's batch: a snapshot as of the index.
    assert meta == Meta(behind, FOLD_VERSION)
    index, _ = await _restored(driver, tmp_path / "at-crash")
    try:
        assert index.digest() == driver.owner.index.digest()
    finally:
        index.close()
    await _restart_and_compare(driver, tmp_path / "restored")


async def _restart_and_compare(driver: NodeDriver, directory: Path) -> None:
    """Reopen the driver's index as a new owner, let it catch up and flush, and check that a
    restore of the changelog then equals its index."""
    await driver.restart()
    await driver.settle()
    await _flush(driver)
    assert await _restored_digest(driver, directory) == driver.owner.index.digest()


async def test_an_index_ahead_of_its_changelog_is_restored_and_refolded_to_a_whole_changelog(
    driver: NodeDriver, tmp_path: Path
) -> None:
    """A crash after steps that committed the group's offset (effects) but before a flush: the
    owner restores the snapshot, refolds the gap below the offset without sending, and notes
    the keys it changes for its next flush."""
    driver.append(enqueued("a"), enqueued("b"))
    await driver.settle()
    await _flush(driver)
    flushed = driver.owner.index.applied_offset()
    await _run_some_jobs(driver)  # an effect: the group's offset commits past the flush
    assert (driver.committed_offset or 0) > flushed + 1
    driver.close()  # a crash: no flush on the way out
    meta = await latest_meta(driver.broker.reader(driver.topics.state), driver.partition)
    assert meta is not None and meta.applied_offset == flushed
    local = LocalIndex(applied_offset=flushed + 1, fold_version=FOLD_VERSION)
    assert plan_open(local, log_start=0, meta=meta, owner=True).action is Action.RESTORE
    own = driver.data_dir / f"p{driver.partition:04d}"
    shutil.rmtree(own)
    index, _ = await _restored(driver, own)
    index.close()
    await _restart_and_compare(driver, tmp_path / "restored")


async def test_a_purged_job_keeps_a_record_of_its_mark_then_a_tombstone(
    driver: NodeDriver, tmp_path: Path
) -> None:
    driver.append(enqueue("a"), enqueue("kept", run_at=10**13))
    await run_to_success(driver, "a")
    await _flush(driver)
    driver.advance(60.0)
    await driver.settle()
    await _flush(driver)
    assert driver.job("a") is None
    last = [decode_change(r) for r in _state_records(driver)[-1]]
    [(_, _, value)] = [c for c in last if c is not None and c[:2] == (JOB_RECORD, b"a")]
    assert value is not None and [c[0] for c in job_changes(b"a", value)[0]] == [TIMELINE]
    restored, _ = await _restored(driver, tmp_path / "restored")
    try:
        assert restored.job("a") is None and restored.job("kept") is not None
        assert restored.timeline("a") == driver.job_timeline("a")
        assert restored.digest() == driver.owner.index.digest()
    finally:
        restored.close()


async def test_a_job_with_nothing_left_becomes_a_tombstone_that_a_restore_applies(
    tmp_path: Path,
) -> None:
    node = NodeDriver(tmp_path / "node", budgets=BUDGETS, changelog_interval_ms=None)
    try:
        node.append(enqueued("gone", run_at=10**13), enqueued("kept"))
        await node.settle()
        await _flush(node)
        index = node.owner.index
        # Whatever deletes a job's keys through the index's batch is seen by the changelog.
        prepared = index.prepare(IndexBatch(), index.applied_offset(), FOLD_VERSION)
        gone = index.job("gone")
        assert gone is not None
        index.delete_secondary(prepared.recorder, gone)  # derived: no record of their own
        prepared.recorder.delete(b"gone", index.h(JOBS))
        for key, _ in [*index.scan(TIMELINE, job_timeline_prefix(b"gone"))][:1]:
            prepared.recorder.delete(key, index.h(TIMELINE))
        index.apply(prepared)
        writer = ChangelogWriter(node.topics.state, 0)
        writer.note(prepared, 0)
        records = writer.flush(index)
        assert decode_change(records[0]) == (JOB_RECORD, b"gone", None)
        node.broker.commit(node.transactional_id, node.outbox.epoch or 0, records, None)
        restored, _ = await _restored(node, tmp_path / "restored")
        try:
            assert restored.job("gone") is None and restored.job("kept") is not None
            assert restored.digest() == index.digest()
        finally:
            restored.close()
    finally:
        node.close()


async def test_a_changelog_of_format_1_still_restores(driver: NodeDriver, tmp_path: Path) -> None:
    """Format 1 wrote every mirrored key as its own record (the keys family too)."""
    await _run_some_jobs(driver)
    index = driver.owner.index
    changes = [*index.mirrored(), *((KEYS, k, v) for k, v in index.scan(KEYS))]
    topic = driver.topics.state
    records = [
        Outgoing(topic=topic, key=change_key(f, k), value=v, partition=0) for f, k, v in changes
    ]
    old = Meta(index.applied_offset(), FOLD_VERSION, format=1)
    records.append(Outgoing(topic=topic, key=META_KEY, value=encode_meta(old), partition=0))
    driver.broker.commit(driver.transactional_id, driver.outbox.epoch or 0, records, None)
    restored, meta = await _restored(driver, tmp_path / "restored")
    try:
        assert meta == old
        assert restored.digest() == index.digest()
    finally:
        restored.close()


def test_a_job_record_round_trips_and_a_malformed_one_is_refused() -> None:
    entries: list[tuple[bytes, bytes | None]] = [
        (struct.pack(">Q", 7), b"entry"),
        (struct.pack(">Q", 9), b""),
        (struct.pack(">Q", 11), None),  # sent as a record of its own
    ]
    value = encode_job(b"state", entries)
    assert value is not None
    prefix = job_timeline_prefix(b"j1")
    assert job_changes(b"j1", value) == (
        [
            (JOBS, b"j1", b"state"),
            (TIMELINE, prefix + struct.pack(">Q", 7), b"entry"),
            (TIMELINE, prefix + struct.pack(">Q", 9), b""),
        ],
        {prefix + struct.pack(">Q", n) for n in (7, 9, 11)},
    )
    assert encode_job(None, []) is None
    assert job_changes(b"j1", encode_job(None, entries) or b"")[0][0][0] == TIMELINE
    with pytest.raises(ValueError, match="format"):
        job_changes(b"j1", b"\x09" + value[1:])
    with pytest.raises((ValueError, struct.error)):
        job_changes(b"j1", value[:-3])


async def test_no_meta_means_no_snapshot(tmp_path: Path) -> None:
    node = NodeDriver(tmp_path / "node")
    try:
        log = node.broker.reader(node.topics.state)
        assert await latest_meta(log, 0) is None
        index = PartitionIndex(tmp_path / "restored", 0)
        try:
            assert await restore_into(log, 0, index) is None
            assert index.applied_offset() == -1
        finally:
            index.close()
    finally:
        node.close()


def test_meta_covers_only_a_complete_snapshot_of_this_fold_reaching_the_log_start() -> None:
    assert Meta(99, FOLD_VERSION).covers(FOLD_VERSION, log_start=100)
    assert Meta(99, FOLD_VERSION, format=1).covers(FOLD_VERSION, log_start=100)
    assert not Meta(98, FOLD_VERSION).covers(FOLD_VERSION, log_start=100)
    assert not Meta(99, FOLD_VERSION - 1).covers(FOLD_VERSION, log_start=0)
    assert not Meta(99, FOLD_VERSION, complete=False).covers(FOLD_VERSION, log_start=0)
    assert decode_meta(b"\x03" + bytes(17)) is None  # a format this version does not know
    assert decode_meta(b"\x01" + bytes(17)) == Meta(0, 0, format=1)


async def test_a_job_too_large_for_one_record_sends_its_entries_on_their_own(
    driver: NodeDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entries past the record's budget (a huge event, a forger's thousands) go as records of
    their own, listed by the job's; a restore drops those its newest record no longer lists."""
    monkeypatch.setattr(changelog_module, "INLINE_ENTRIES_BYTES", 200)
    driver.append(enqueue("a"), enqueue("kept", run_at=10**13))
    await run_to_success(driver, "a")
    await _flush(driver)
    [flush] = _state_records(driver)
    own = [c for r in flush if (c := decode_change(r)) and c[0] == TIMELINE]
    assert {timeline_job(key) for _, key, _ in own} == {b"a"} and len(own) >= 2
    assert all(len(r.value or b"") < 1_000 for r in flush if r.key and r.key.startswith(b"job"))
    assert await _restored_digest(driver, tmp_path / "whole") == driver.owner.index.digest()
    driver.advance(60.0)  # "a" is purged: its entries but the purge's go, not listed any more
    await driver.settle()
    await _flush(driver)
    assert len(driver.job_timeline("a")) == 1
    assert await _restored_digest(driver, tmp_path / "purged") == driver.owner.index.digest()
