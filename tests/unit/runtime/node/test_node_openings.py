"""A node takes the group's assignment in its rebalance callback without opening anything there
(aiokafka heartbeats again only once that callback returns: issue 9, the take-over stall): the
partitions open in the background, held back from every fetch and never stepped before they are
open, and a partition revoked while it opens is closed cleanly (its index lock free, its producer
closed, nothing decided)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from evsched.adapters.index.store import PartitionIndex
from evsched.runtime.node import health
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.rebalance import NodeRebalance
from evsched.runtime.projection import index_threads
from evsched.runtime.projection.restore import open_index
from tests.unit.node_driver_events import enqueued
from tests.unit.runtime.node.test_node_fenced import ME, Group, Rig


class HeldOpens:
    """``open_index`` as the node's threads call it, held on its thread for ``held`` partitions
    until ``release`` is set."""

    def __init__(self, held: Collection[int]) -> None:
        self.held = set(held)
        self.entered = threading.Event()  # a held open is under way on its thread
        self.release = threading.Event()

    def __call__(self, data_dir: Path, partition: int) -> PartitionIndex:
        if partition in self.held:
            self.entered.set()
            assert self.release.wait(10), "the test never released the open"
        return open_index(data_dir, partition)

    async def started(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 10), "the open never started"


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "RETRY_FIRST_S", 0.01)


def held_opens(monkeypatch: pytest.MonkeyPatch, held: Collection[int]) -> HeldOpens:
    opens = HeldOpens(held)
    monkeypatch.setattr(index_threads, "open_index", opens)
    return opens


def index_free(data_dir: Path, partition: int) -> bool:
    """Whether the partition's index can be opened: no handle of it is left holding its lock."""
    open_index(data_dir, partition).close()  # else "LOCK: No locks available"
    return True


async def test_the_assignment_callback_returns_at_once_and_the_partition_opens_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig(tmp_path, Group({0: ME}))
    rig.append(enqueued("a"))
    opens = held_opens(monkeypatch, [0])
    listener = NodeRebalance(rig.node)
    await listener.revoked([])  # the first join
    async with asyncio.timeout(5):  # before the fix: waited on the open, held on its thread
        await listener.assigned([0])
    await opens.started()
    assert not rig.node.rebalancing and rig.node.opener.openings.opening() == {0}
    assert rig.node.health.phase(0) is Phase.OPENING and 0 not in rig.node.owned
    # Its fetches are held from the callback on: nothing from the group's offset is folded,
    # and nothing is decided before the partition is open.
    assert 0 in rig.consumer.paused and rig.consumer.fetch() == {}
    assert rig.outboxes == [] and rig.leased() == []
    opens.release.set()
    await rig.pump(lambda: rig.leased() == [("a", 1)])
    assert rig.node.opener.openings.opening() == frozenset() and 0 not in rig.consumer.paused
    await rig.node.revoke([0])
    assert rig.node.health.phase(0) is Phase.CLOSED and index_free(tmp_path, 0)


async def test_a_partition_revoked_while_its_index_opens_is_closed_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig(tmp_path, Group({0: ME}))
    rig.append(enqueued("a"))
    opens = held_opens(monkeypatch, [0])
    listener = NodeRebalance(rig.node)
    await listener.assigned([0])
    await opens.started()
    revoking = asyncio.create_task(listener.revoked([0]))
    for _ in range(20):
        await asyncio.sleep(0)
    # The open goes on on its thread (it cannot be stopped): the revoke waits to close it.
    assert not revoking.done()
    opens.release.set()
    async with asyncio.timeout(10):
        await revoking
    assert rig.node.health.phase(0) is Phase.CLOSED and rig.node.owned == {}
    assert rig.node.opener.openings.opening() == frozenset()
    assert rig.outboxes == [] and rig.leased() == []
    assert index_free(tmp_path, 0)


async def test_a_partition_revoked_once_its_producer_started_is_closed_cleanly(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, Group({0: ME}))
    rig.append(enqueued("a"))
    asking, answer = asyncio.Event(), asyncio.Event()
    group_offset = rig.consumer.committed

    async def committed(partition: int) -> int | None:
        asking.set()
        await answer.wait()  # the group's coordinator is slow to answer: never, here
        return await group_offset(partition)

    rig.consumer.committed = committed  # type: ignore[method-assign]
    listener = NodeRebalance(rig.node)
    await listener.assigned([0])
    async with asyncio.timeout(10):
        await asking.wait()
        assert len(rig.outboxes) == 1 and not rig.outboxes[0].closed  # started: fenced the last
        await listener.revoked([0])
    # Its producer is closed before the revoke returns, as an open partition's would be.
    assert rig.outboxes[0].closed and rig.node.owned == {}
    assert rig.node.health.phase(0) is Phase.CLOSED and rig.leased() == []
    assert index_free(tmp_path, 0)


async def test_a_revoke_of_one_partition_of_an_assignment_still_opening_reopens_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig(tmp_path, Group({0: ME, 1: ME}))
    rig.consumer.assigned = {0, 1}
    rig.append(enqueued("a"))  # on partition 0
    opens = held_opens(monkeypatch, [1])
    listener = NodeRebalance(rig.node)
    await listener.assigned([0, 1])
    await opens.started()  # partition 0's index is open by now, or soon: it waits for 1's
    rig.consumer.assigned = {0}
    revoking = asyncio.create_task(rig.node.revoke([1]))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not revoking.done()  # waits for partition 1's open, to close it
    opens.release.set()
    async with asyncio.timeout(10):
        await revoking
    assert rig.node.health.phase(1) is Phase.CLOSED and index_free(tmp_path, 1)
    # Partition 0's open went with its assignment's: its index was closed again, and it is
    # reopened as a failed partition is (had the index stayed open, that would fail its lock).
    assert rig.node.health.phase(0) is Phase.FAILED and rig.outboxes == []
    await rig.pump(lambda: rig.leased() == [("a", 1)])
    assert rig.node.health.phase(0) in (Phase.CATCHING_UP, Phase.RUNNING)
    await rig.node.revoke([0])
    assert index_free(tmp_path, 0)


class StuckStandby:
    """A standby copy that will not let go of its partitions (a bug, a disk error)."""

    async def release(self, partitions: Collection[int]) -> None:
        raise RuntimeError("the copy would not let go")

    def took_over(self, partition: int, resume_offset: int, end_offset: int) -> None:
        pass


async def test_an_assignment_whose_open_fails_as_a_whole_is_reopened_partition_by_partition(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, Group({0: ME}))
    rig.append(enqueued("a"))
    rig.node.standby = StuckStandby()  # type: ignore[assignment]
    with capture_logs() as logs:
        await NodeRebalance(rig.node).assigned([0])
        # Not left OPENING for good (ready, and never retried): failed, logged, reopened.
        await rig.pump(lambda: rig.leased() == [("a", 1)])
    failed = [e for e in logs if e["event"] == "partition_opens_failed"]
    assert [(e["partitions"], e["log_level"]) for e in failed] == [([0], "error")]
    assert "the copy would not let go" in failed[0]["error"]
    reopened = [e for e in logs if e["event"] == "partition_open_failed"]
    assert [e["partition"] for e in reopened] == [0]
    await rig.node.revoke([0])
