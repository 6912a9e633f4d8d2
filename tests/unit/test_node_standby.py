"""A node's hand-over between its standby copy and ownership, without a broker: the group's
assignment releases the copy (its index closed) before the node opens the partition on that very
index, at the copy's offset and with plan USE_LOCAL, and the group's revoke holds it again."""

from __future__ import annotations

from pathlib import Path

from evsched.adapters.index import PartitionIndex
from evsched.core.fold import FOLD_VERSION
from evsched.runtime.changelog_restore import Action, OpenPlan
from evsched.runtime.lifecycle import Phase
from evsched.runtime.node import _Rebalance
from evsched.runtime.standby import Standby
from evsched.testing import MemoryPartitionLog
from tests.unit.test_node_lifecycle import node_over
from tests.unit.test_standby import Offsets, Recorder, add_jobs, until


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

    node._open = open_  # type: ignore[method-assign]
    try:
        await standby.hold([0])
        await until(lambda: standby.projectors[0].next_offset == 9, "the copy to be warm")
        await node.assign([0])
        # The copy's offset: the owner seeks past it and folds the tail from the group's offset.
        assert plans == [(0, 8, Action.USE_LOCAL)]
        assert consumer.seeks == [(0, 9)] and standby.taken == {0: 9}
        await _Rebalance(node).revoked([0])
        assert 0 in standby.projectors and node.health.phase(0) is Phase.CLOSED
        offsets.offsets[0] = 12
        await until(lambda: standby.projectors[0].next_offset == 11, "the copy to follow again")
    finally:
        await standby.stop()
