"""A node's hand-over between its standby copy and ownership, without a broker: the group's
assignment releases the copy (its index closed) before the node opens the partition on that very
index, at the copy's offset and with plan USE_LOCAL, and the group's revoke holds it again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evsched.adapters.index.store import PartitionIndex
from evsched.core.fold import FOLD_VERSION
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.rebalance import NodeRebalance
from evsched.runtime.node.standby import Standby
from evsched.runtime.projection.changelog_restore import Action, OpenPlan
from evsched.runtime.projection.restore import open_index
from evsched.testing import MemoryPartitionLog
from tests.unit.runtime.node.test_node_lifecycle import node_over
from tests.unit.runtime.node.test_standby import Offsets, Recorder, add_jobs, until
from tests.unit.runtime.projection.test_changelog_restore import _history


async def test_the_group_hands_a_standby_copy_to_the_owner_and_back(tmp_path: Path) -> None:
    log = MemoryPartitionLog(partitions=1)
    add_jobs(log, 0, 0, 6)  # offsets 0..11
    node, consumer, _ = node_over(tmp_path, log, committed=10)
    offsets = Offsets()
    offsets.offsets[0] = 10
    standby = Standby(log, offsets, tmp_path / "n", logger=Recorder())
    await standby.start()
    node.standby = standby
    plans: list[tuple[int, int, Action]] = []

    async def open_(_: object, index: PartitionIndex, plan: OpenPlan | BaseException) -> None:
        # The standby let go of the index first: else this handle could not have been opened.
        assert 0 not in standby.projectors
        assert isinstance(plan, OpenPlan)
        plans.append((index.partition, index.applied_offset(), plan.action))
        assert index.fold_version() == FOLD_VERSION
        index.close()

    node.opener.open = open_  # type: ignore[method-assign]
    try:
        await standby.hold([0])
        await until(lambda: standby.projectors[0].next_offset == 9, "the copy to be warm")
        await node.assign([0])
        # The copy's offset: the owner seeks past it and folds the tail from the group's offset.
        assert plans == [(0, 8, Action.USE_LOCAL)]
        assert consumer.seeks == [(0, 9)] and standby.taken == {0: 9}
        await NodeRebalance(node).revoked([0])
        assert 0 in standby.projectors and node.health.phase(0) is Phase.CLOSED
        offsets.offsets[0] = 12
        await until(lambda: standby.projectors[0].next_offset == 11, "the copy to follow again")
    finally:
        await standby.stop()


async def test_a_standby_without_an_index_restores_it_from_the_changelog_then_follows(
    tmp_path: Path,
) -> None:
    driver = await _history(tmp_path)
    applied, digest = driver.owner.index.applied_offset(), driver.owner.index.digest()
    driver.close()
    events = driver.broker.reader(driver.topics.events)
    state = driver.broker.reader(driver.topics.state)
    events.trim(0, applied)  # an empty copy folded from the log's start would miss jobs
    offsets = Offsets()
    offsets.offsets[0] = applied + 1
    standby = Standby(
        events, offsets, tmp_path / "standby", logger=Recorder(), open_state=lambda _: state
    )
    await standby.start()
    try:
        await standby.hold([0])
        await until(lambda: 0 in standby.projectors, "the copy to be restored and held")
        index = standby.projectors[0].index
        assert index.applied_offset() == applied and index.digest() == digest
        assert standby.preparing == {}
    finally:
        await standby.stop()


class Stalled(MemoryPartitionLog):
    """A changelog reader that never finishes starting."""

    async def start(self) -> None:
        await asyncio.Event().wait()


async def test_an_assignment_cancels_a_copy_being_restored(tmp_path: Path) -> None:
    events = MemoryPartitionLog(partitions=1)
    events.trim(0, 5)
    standby = Standby(
        events, Offsets(), tmp_path, logger=Recorder(), open_state=lambda _: Stalled("ns.state")
    )
    await standby.start()
    try:
        await standby.hold([0])
        task = standby.preparing[0]
        await standby.release([0])
        assert task.cancelled() and standby.preparing == {} and standby.projectors == {}
        open_index(tmp_path, 0).close()  # nothing holds or swaps the owner's index
    finally:
        await standby.stop()
