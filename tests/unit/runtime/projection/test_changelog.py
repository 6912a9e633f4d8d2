"""The state changelog through NodeDriver: every index change goes out in the step's transaction,
ends with a meta record, and a restore from it equals the node's own index (digest), including
after a crash between the commit and the index write, and with deletes as tombstones."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.adapters.index.store import DUE, JOBS, IndexBatch, PartitionIndex, time_key
from evsched.core.events import Effect
from evsched.core.fold import FOLD_VERSION
from evsched.core.planner import PlannerBudgets
from evsched.runtime.projection.changelog import (
    META_KEY,
    ChangelogWriter,
    Meta,
    decode_change,
    decode_meta,
    latest_meta,
    restore_into,
)
from evsched.testing import NodeDriver, SimulatedCrash
from tests.unit.node_driver_events import enqueued, every_minute, failed, started, succeeded

BUDGETS = PlannerBudgets(dispatch_timeout_ms=30_000)


async def _run_some_jobs(driver: NodeDriver) -> None:
    driver.append(enqueued("a"), enqueued("b"), enqueued("later", run_at=10**13))
    driver.append(every_minute("cron"))
    await driver.settle()
    first, second = driver.dispatched()[:2]
    driver.append(started(first), succeeded(first, Effect(kind="mail", payload=b"x")))
    driver.append(started(second), failed(second, retryable=False))
    driver.append_raw(b"\x00garbage")
    await driver.settle()


async def _restored(driver: NodeDriver, directory: Path) -> tuple[PartitionIndex, Meta | None]:
    log = driver.broker.reader(driver.topics.state)
    index = PartitionIndex(directory, driver.partition)
    return index, await restore_into(log, driver.partition, index)


async def test_every_transaction_ends_with_a_meta_record_at_its_applied_offset(
    driver: NodeDriver,
) -> None:
    await _run_some_jobs(driver)
    for transaction in driver.broker.transactions:
        state = [r for r in transaction.records if r.topic == driver.topics.state]
        if not state:
            continue
        assert state[-1].key == META_KEY
        meta = decode_meta(state[-1].value or b"")
        assert meta is not None and meta.fold_version == FOLD_VERSION
        assert all(r.partition == driver.partition for r in state)
    meta = await latest_meta(driver.broker.reader(driver.topics.state), driver.partition)
    assert meta == Meta(driver.owner.index.applied_offset(), FOLD_VERSION)
    families = {c[0] for r in driver.changelog() if (c := decode_change(r)) is not None}
    assert {"jobs", "timeline", "schedules", "undecodable"} <= families
    assert not families & {"due", "leases", "cron_due", "meta"}  # derived, never sent


async def test_a_record_that_sends_nothing_still_gets_its_changelog_before_its_index(
    driver: NodeDriver,
) -> None:
    driver.append(enqueued("later", run_at=driver.clock.now_ms() + 60_000))
    await driver.settle()
    assert driver.committed_offset is None  # its consumer offset still rides on a later one
    meta = await latest_meta(driver.broker.reader(driver.topics.state), driver.partition)
    assert meta is not None and meta.applied_offset == driver.owner.index.applied_offset() == 0


async def test_a_restore_from_the_changelog_equals_the_nodes_index(
    driver: NodeDriver, tmp_path: Path
) -> None:
    await _run_some_jobs(driver)
    index, meta = await _restored(driver, tmp_path / "restored")
    try:
        assert meta is not None and meta.applied_offset == driver.owner.index.applied_offset()
        assert index.digest() == driver.owner.index.digest()
        assert index.next_due_at() == driver.owner.index.next_due_at()  # derived families
    finally:
        index.close()


async def test_a_crash_between_commit_and_index_leaves_the_changelog_complete(
    driver: NodeDriver, tmp_path: Path
) -> None:
    await _run_some_jobs(driver)
    driver.append(enqueued("c"))
    driver.crash_after_commit()
    with pytest.raises(SimulatedCrash):
        await driver.settle()
    behind = driver.owner.index.applied_offset()
    meta = await latest_meta(driver.broker.reader(driver.topics.state), driver.partition)
    assert meta is not None and meta.applied_offset > behind  # the changelog went, the index not
    await driver.restart()
    await driver.settle()
    index, restored = await _restored(driver, tmp_path / "restored")
    try:
        assert restored is not None
        assert restored.applied_offset == driver.owner.index.applied_offset()
        assert index.digest() == driver.owner.index.digest()
    finally:
        index.close()


async def test_an_index_delete_becomes_a_tombstone_that_a_restore_applies(
    tmp_path: Path,
) -> None:
    node = NodeDriver(tmp_path / "node", budgets=BUDGETS)
    try:
        node.append(enqueued("gone", run_at=10**13), enqueued("kept"))
        await node.settle()
        index = node.owner.index
        # A purge (or anything else) deleting through the index's batch is seen by the changelog;
        # the time families are derived on restore, so their deletes need no record.
        prepared = index.prepare(IndexBatch(), index.applied_offset(), FOLD_VERSION)
        prepared.recorder.delete(b"gone", index._h(JOBS))
        prepared.recorder.delete(time_key(10**13, "gone"), index._h(DUE))
        assert len(prepared.changes) == 1
        records = ChangelogWriter(node.topics.state, 0).records(prepared)
        assert decode_change(records[0]) == ("jobs", b"gone", None)
        node.broker.commit(node.transactional_id, node.outbox.epoch or 0, records, None)
        index.apply(prepared)
        restored, _ = await _restored(node, tmp_path / "restored")
        try:
            assert restored.job("gone") is None and restored.job("kept") is not None
            assert restored.digest() == index.digest()
        finally:
            restored.close()
    finally:
        node.close()


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
    assert not Meta(98, FOLD_VERSION).covers(FOLD_VERSION, log_start=100)
    assert not Meta(99, FOLD_VERSION - 1).covers(FOLD_VERSION, log_start=0)
    assert not Meta(99, FOLD_VERSION, complete=False).covers(FOLD_VERSION, log_start=0)
    assert decode_meta(b"\x02" + bytes(17)) is None  # a format this version does not know
