"""Opening a partition with the changelog, without a broker: the plan for every local index, a
node restoring a missing index (or one behind a trimmed log) from the changelog twin, a trimmed
log without a snapshot refused loudly, and a changelog seeded with an index it does not hold."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from evsched.adapters.index.store import TIMELINE, IndexBatch, PartitionIndex
from evsched.core.fold import FOLD_VERSION
from evsched.core.planner import PlannerBudgets
from evsched.ports import Outgoing
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.node import Node
from evsched.runtime.projection.changelog import (
    ChangelogWriter,
    Meta,
    change_key,
    latest_meta,
    restore_into,
)
from evsched.runtime.projection.changelog_restore import (
    RESTORE_AHEAD_RECORDS,
    Action,
    LocalIndex,
    local_index,
    plan_open,
    seed,
)
from evsched.runtime.projection.replica_restore import prepare_partitions
from evsched.testing import MemoryPartitionLog, NodeDriver
from tests.unit.node_driver_events import enqueued, started, succeeded
from tests.unit.runtime.node.test_node_lifecycle import node_over, poll_until

V = FOLD_VERSION


@pytest.mark.parametrize(
    ("local", "log_start", "meta", "action", "seeds"),
    [
        (LocalIndex(), 0, None, Action.USE_LOCAL, False),  # a new partition
        (LocalIndex(applied_offset=5, fold_version=V), 0, None, Action.USE_LOCAL, True),
        (LocalIndex(applied_offset=5, fold_version=V), 0, Meta(5, V), Action.USE_LOCAL, False),
        (LocalIndex(applied_offset=5, fold_version=V), 0, Meta(4, V), Action.USE_LOCAL, True),
        (LocalIndex(applied_offset=5, fold_version=V), 0, Meta(5, V + 1), Action.USE_LOCAL, True),
        (LocalIndex(), 0, Meta(5, V), Action.USE_LOCAL, False),  # a short log: folded
        (LocalIndex(), 0, Meta(RESTORE_AHEAD_RECORDS, V), Action.RESTORE, False),  # a long one
        (
            LocalIndex(applied_offset=5, fold_version=V),
            0,
            Meta(6 + RESTORE_AHEAD_RECORDS, V),
            Action.RESTORE,
            False,
        ),
        (LocalIndex(applied_offset=5, fold_version=V), 10, Meta(20, V), Action.RESTORE, False),
        (LocalIndex(applied_offset=5, fold_version=V + 1), 0, Meta(5, V), Action.RESTORE, False),
        (LocalIndex(applied_offset=5, fold_version=V + 1), 0, None, Action.REBUILD, False),
        (LocalIndex(), 10, None, Action.REFUSE, False),
        (LocalIndex(), 10, Meta(8, V), Action.REFUSE, False),  # the snapshot does not reach it
        (LocalIndex(), 10, Meta(20, V, complete=False), Action.REFUSE, False),
        (
            LocalIndex(applied_offset=5, fold_version=V + 1),
            10,
            Meta(20, V + 1),
            Action.REFUSE,
            False,
        ),
    ],
)
def test_plan_for_every_local_index(
    local: LocalIndex, log_start: int, meta: Meta | None, action: Action, seeds: bool
) -> None:
    plan = plan_open(local, log_start=log_start, meta=meta)
    assert (plan.action, plan.seed) == (action, seeds)
    if action is Action.REFUSE:
        assert f"starts at offset {log_start}" in plan.reason and "archive" in plan.reason


@pytest.mark.parametrize(
    ("meta", "action", "seeds"),
    [
        (Meta(5, V), Action.USE_LOCAL, False),
        (Meta(7, V), Action.USE_LOCAL, False),  # behind it: folded on, its keys noted
        # Ahead of the changelog (a crash before a flush): restored, never written on from.
        (Meta(4, V), Action.RESTORE, False),
        (Meta(4, V, format=1), Action.USE_LOCAL, True),  # an older format: seeded anew
        (Meta(5, V, format=1), Action.USE_LOCAL, True),
        (Meta(4, V, complete=False), Action.USE_LOCAL, True),
        (None, Action.USE_LOCAL, True),
    ],
)
def test_an_owner_never_writes_on_from_a_changelog_behind_its_index_or_of_an_older_format(
    meta: Meta | None, action: Action, seeds: bool
) -> None:
    local = LocalIndex(applied_offset=5, fold_version=V)
    plan = plan_open(local, log_start=0, meta=meta, owner=True)
    assert (plan.action, plan.seed) == (action, seeds)
    replica = plan_open(local, log_start=0, meta=meta)  # a replica writes none: it folds on
    assert replica.action is Action.USE_LOCAL


async def _history(tmp_path: Path) -> NodeDriver:
    driver = NodeDriver(tmp_path / "owner", budgets=PlannerBudgets(dispatch_timeout_ms=30_000))
    driver.append(*(enqueued(f"job-{i}") for i in range(6)), enqueued("later", run_at=10**13))
    await driver.settle()
    for dispatch in driver.dispatched()[:4]:
        driver.append(started(dispatch), succeeded(dispatch))
    await driver.settle()
    await driver.owner.flush_changelog()  # as a node does when the partition is revoked
    return driver


async def _restored_by_a_node(
    tmp_path: Path, events: MemoryPartitionLog, state: MemoryPartitionLog
) -> tuple[list[tuple[int, int | None, int]], Node, list[dict[str, Any]]]:
    node, consumer, opened = node_over(tmp_path, events, committed=None)
    readers: list[Collection[int]] = []

    def open_state(partitions: Collection[int]) -> MemoryPartitionLog:
        readers.append(partitions)
        return state

    node.restores.open_state = open_state
    node.health.assigned([0])
    node.health.move(0, Phase.OPENING)
    with capture_logs() as logs:
        node.restores.start(node._consumer, 0, "test")  # type: ignore[arg-type]
        await poll_until(
            node, consumer, lambda: node.health.phase(0) not in (Phase.OPENING, Phase.RESTORING)
        )
    # One reader of the changelog both plans and restores; the restored index opens unplanned.
    assert readers == [[0]]
    return opened, node, logs


async def test_a_node_without_an_index_restores_it_from_the_changelog(tmp_path: Path) -> None:
    driver = await _history(tmp_path)
    applied, digest = driver.owner.index.applied_offset(), driver.owner.index.digest()
    driver.close()
    events = driver.broker.reader(driver.topics.events)
    state = driver.broker.reader(driver.topics.state)
    events.trim(0, applied)  # and the log was trimmed since: the snapshot covers the gap
    opened, _, logs = await _restored_by_a_node(tmp_path, events, state)
    assert opened == [(0, FOLD_VERSION, applied)]
    restored = [e for e in logs if e["event"] == "partition_index_restored"]
    assert len(restored) == 1 and restored[0]["applied_offset"] == applied
    index = PartitionIndex(tmp_path / "n" / "p0000", 0)
    try:
        assert index.digest() == digest
    finally:
        index.close()


async def test_a_trimmed_log_without_a_snapshot_is_refused_naming_offsets_and_remedy(
    tmp_path: Path,
) -> None:
    driver = await _history(tmp_path)
    driver.close()
    events = driver.broker.reader(driver.topics.events)
    events.trim(0, 3)
    opened, node, logs = await _restored_by_a_node(tmp_path, events, MemoryPartitionLog())
    assert opened == [] and node.health.phase(0) is Phase.FAILED
    [refused] = [e for e in logs if e["event"] == "partition_index_rebuild_refused"]
    assert refused["log_level"] == "error" and refused["partition"] == 0
    assert "starts at offset 3" in refused["reason"] and "no snapshot" in refused["reason"]
    assert "archive" in refused["fix"]
    assert not list((tmp_path / "n").glob(".p0000.*"))  # no scratch copy left behind


async def test_seeding_writes_the_whole_index_and_deletes_what_it_does_not_hold(
    tmp_path: Path,
) -> None:
    driver = await _history(tmp_path)
    try:
        writer = ChangelogWriter(driver.topics.state, 0)
        # Records of format 1 (every index key its own record): a job and its timeline entry.
        entry = next(iter(driver.owner.index.scan(TIMELINE)))
        stale = [
            Outgoing(topic=driver.topics.state, key=change_key(f, k), value=v, partition=0)
            for f, k, v in (("jobs", b"ghost", b"old state"), ("timeline", *entry))
        ]
        stale.append(writer.meta(Meta(0, FOLD_VERSION, format=1)))
        driver.broker.commit(driver.transactional_id, driver.outbox.epoch or 0, stale, None)
        state = driver.broker.reader(driver.topics.state)
        owner = driver.owner
        await seed(state, driver.outbox, owner.quarantine, writer, owner.index)
        state = driver.broker.reader(driver.topics.state)
        meta = await latest_meta(state, 0)
        assert meta == Meta(owner.index.applied_offset(), FOLD_VERSION)
        index = PartitionIndex(tmp_path / "restored", 0)
        try:
            await restore_into(state, 0, index)
            assert index.job("ghost") is None
            assert index.digest() == owner.index.digest()
        finally:
            index.close()
    finally:
        driver.close()


def _foreign_index(data_dir: Path, partition: int, applied: int) -> None:
    index = PartitionIndex(data_dir / f"p{partition:04d}", partition)
    index.write(IndexBatch(), applied, V + 1)
    index.close()


async def test_a_replica_without_a_changelog_plans_as_with_one(tmp_path: Path) -> None:
    """No <ns>.state yet: another fold version's index over a whole log is reset (refolded), as
    with a changelog; one behind a trimmed log is refused; one that reaches the log is kept."""
    _foreign_index(tmp_path, 0, applied=5)  # a whole log: refolded from offset 0
    _foreign_index(tmp_path, 1, applied=5)  # a trimmed log: refused
    locals_ = {p: local_index(tmp_path, p) for p in range(3)}
    starts = {0: 0, 1: 3, 2: 0}
    prepared = await prepare_partitions(None, tmp_path, locals_, starts)
    assert list(prepared.refused) == [1]
    assert not (tmp_path / "p0000").exists()
    assert local_index(tmp_path, 1) == locals_[1]
