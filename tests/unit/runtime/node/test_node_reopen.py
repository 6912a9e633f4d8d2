"""A partition reopening after its transaction was lost, or opening once its index was restored,
waits for its new producer's start beside the node's poll loop, not in it nor under the node's
lock: while the transaction coordinator cannot answer (too few replicas of its partition in sync),
the node's other partitions go on stepping, the poll loop and the group's revokes go on, and a
revoke gives the start up. The node runs over in-memory twins (``test_node_fenced.Rig``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.core.events import Event, JobLeased, entity_id
from evsched.core.fold import FOLD_VERSION
from evsched.runtime.node import health, ownership
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.outbox_starts import OutboxStarts
from evsched.runtime.node.rebalance import NodeRebalance
from evsched.runtime.projection.restore import open_index
from evsched.testing import MemoryBroker, MemoryOutbox
from tests.unit.node_driver_events import enqueued
from tests.unit.runtime.node.test_node_fenced import ME, Group, Rig
from tests.unit.runtime.projection.test_restore import write_foreign_version


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(ownership, "ASK_AGAIN_FIRST_S", 0.01)


class Coordinator:
    """Holds the start of every producer of partition 0 after the first ``held_after`` (by
    default its reopen's) until ``answer`` is set, as a transaction coordinator short of in-sync
    replicas does."""

    def __init__(self, rig: Rig, held_after: int = 1) -> None:
        self.answer = asyncio.Event()
        self.starts: list[int] = []
        self.cancelled = 0
        start_outbox = rig.node._start_outbox

        async def start(partition: int) -> MemoryOutbox:
            self.starts.append(partition)
            if partition == 0 and self.starts.count(0) > held_after:
                try:
                    await self.answer.wait()
                except asyncio.CancelledError:
                    self.cancelled += 1
                    raise
            return await start_outbox(partition)

        rig.node._start_outbox = start  # type: ignore[method-assign,assignment]


def append_to(rig: Rig, partition: int, *events: Event) -> None:
    for event in events:
        rig.broker.append(
            rig.topic, avro.encode_event(event), key=entity_id(event).encode(), partition=partition
        )


def leased_on(rig: Rig, partition: int) -> list[tuple[str, int]]:
    found = []
    for record in rig.broker.records(rig.topic, partition):
        assert record.value is not None
        event = avro.decode_event(record.value)
        if isinstance(event, JobLeased):
            found.append((event.job_id, event.token))
    return found


async def two_partitions_and_a_lost_transaction(tmp_path: Path) -> tuple[Rig, Coordinator]:
    """The node owns partitions 0 and 1; 0's transaction leasing "b" was lost, and its reopen
    waits for the coordinator."""
    rig = Rig(tmp_path, Group({0: ME, 1: ME}))
    rig.consumer.assigned = {0, 1}
    state = rig.node.topics.state  # the changelog as the outboxes wrote it, both partitions
    rig.node.restores.open_state = lambda partitions: rig.broker.reader(state, 2)
    coordinator = Coordinator(rig)
    rig.append(enqueued("a"))
    await rig.node.assign([0, 1])
    await rig.pump(lambda: rig.leased() == [("a", 1)])
    rig.abort.add("b")
    rig.append(enqueued("b"))
    await rig.pump(lambda: coordinator.starts.count(0) == 2)
    return rig, coordinator


async def test_a_reopen_waiting_for_its_producer_holds_back_no_other_partition(
    tmp_path: Path,
) -> None:
    rig, coordinator = await two_partitions_and_a_lost_transaction(tmp_path)
    append_to(rig, 1, enqueued("c"))
    # The poll loop (pump: fetch, feed, adopt orphans under the node's lock) goes on: the
    # other partition leases its job while partition 0's producer start waits.
    await rig.pump(lambda: leased_on(rig, 1) == [("c", 1)])
    assert rig.node.health.phase(0) is Phase.FAILED and 0 not in rig.node.owned
    assert rig.node.opener.outbox_starts.starting() == {0}
    assert rig.leased() == [("a", 1)]  # b's lease went with the lost transaction

    coordinator.answer.set()
    await rig.pump(lambda: rig.leased() == [("a", 1), ("b", 1)])
    assert 0 in rig.node.owned and not rig.node.opener.outbox_starts.starting()
    assert coordinator.starts.count(0) == 2 and coordinator.cancelled == 0
    await rig.node.revoke([0, 1])


async def test_a_revoke_gives_up_a_producer_start_that_waits(tmp_path: Path) -> None:
    rig, coordinator = await two_partitions_and_a_lost_transaction(tmp_path)
    opened = len(rig.outboxes)
    await rig.node.revoke([0, 1])
    assert coordinator.cancelled == 1
    assert not rig.node.opener.outbox_starts.starting()
    assert rig.node.health.phase(0) is Phase.CLOSED and rig.node.owned == {}
    assert len(rig.outboxes) == opened and all(box.closed for box in rig.outboxes)


async def restored_and_its_producer_held(tmp_path: Path) -> tuple[Rig, Coordinator]:
    """Partition 0's index was built by another fold version: the node rebuilds it from the log,
    then its producer's start waits for the coordinator."""
    open_index(tmp_path, 0).close()
    write_foreign_version(tmp_path, 0, FOLD_VERSION + 1)
    rig = Rig(tmp_path, Group({0: ME}))
    rig.node.restores.open_log = lambda partitions: rig.broker.reader(rig.topic)
    coordinator = Coordinator(rig, held_after=0)
    rig.append(enqueued("a"))
    await rig.node.assign([0])
    assert rig.node.health.phase(0) is Phase.RESTORING
    async with asyncio.timeout(10):
        while not coordinator.starts:
            await asyncio.sleep(0.01)
    return rig, coordinator


async def test_a_restored_partition_waiting_for_its_producer_holds_back_no_poll(
    tmp_path: Path,
) -> None:
    rig, coordinator = await restored_and_its_producer_held(tmp_path)
    # Before: the restore's end opened the partition, producer start included, under the
    # node's lock, and the poll loop's pass waited for the coordinator with it.
    async with asyncio.timeout(5):
        async with rig.node.lock:
            await rig.node._adopt_orphans(rig.consumer)  # type: ignore[arg-type]
    assert rig.node.health.phase(0) is Phase.RESTORING and 0 not in rig.node.owned
    assert rig.node.opener.outbox_starts.starting() == {0} and rig.outboxes == []

    coordinator.answer.set()
    await rig.pump(lambda: rig.leased() == [("a", 1)])  # opened by a later pass
    assert 0 in rig.node.owned and not rig.node.opener.outbox_starts.starting()
    assert coordinator.starts == [0] and len(rig.outboxes) == 1
    await rig.node.revoke([0])


async def test_a_revoke_gives_up_a_restored_partitions_producer_start_that_waits(
    tmp_path: Path,
) -> None:
    rig, coordinator = await restored_and_its_producer_held(tmp_path)
    listener = NodeRebalance(rig.node)
    async with asyncio.timeout(5):  # before: it waited for the node's lock, held by the start
        await listener.revoked([0])
    assert coordinator.cancelled == 1 and not rig.node.opener.outbox_starts.starting()
    assert rig.node.health.phase(0) is Phase.CLOSED and rig.node.owned == {}
    assert rig.outboxes == []
    # Assigned again: it opens once (its index is of this fold version now), and the start
    # given up leaves nothing to reopen it a second time.
    coordinator.answer.set()
    await listener.assigned([0])
    await rig.pump(lambda: rig.leased() == [("a", 1)])
    await rig.idle(0.1)
    assert coordinator.starts == [0, 0] and len(rig.outboxes) == 1
    assert rig.node.health.phase(0) in (Phase.CATCHING_UP, Phase.RUNNING)
    await rig.node.revoke([0])


async def ticks(count: int = 10) -> None:
    """Let the start tasks run (they never wait on anything here)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_started_outbox_nobody_took_is_closed_on_revoke() -> None:
    box = MemoryOutbox(MemoryBroker())

    async def start(partition: int) -> MemoryOutbox:
        await box.start()
        return box

    starts: OutboxStarts[MemoryOutbox] = OutboxStarts(start)
    assert starts.take(3) is None  # the first ask starts it
    await ticks()
    await starts.cancel([3])
    assert box.epoch is not None and box.closed and not starts.starting()


async def test_a_failed_start_is_handed_over_once_and_the_next_ask_starts_again() -> None:
    calls: list[int] = []

    async def failing(partition: int) -> MemoryOutbox:
        calls.append(partition)
        raise ConnectionError("coordinator away")

    starts: OutboxStarts[MemoryOutbox] = OutboxStarts(failing)
    assert starts.take(2) is None
    await ticks()
    failed = starts.take(2)
    assert isinstance(failed, ConnectionError) and calls == [2]
    assert not starts.starting()
    assert starts.take(2) is None and starts.starting() == {2}  # asked again: a new start
    await ticks()
    await starts.cancel([2])  # a failed start is dropped, nothing to close
    assert calls == [2, 2] and not starts.starting()
