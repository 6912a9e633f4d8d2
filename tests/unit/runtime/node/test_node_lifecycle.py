"""A node's partition lifecycle without a broker: the transition table is enforced, and a partition
whose index another fold version built is rebuilt from the log (the PartitionLog twin) and opened,
logged and counted, or refused loudly and not retried soon when the log lost its start."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from evsched.adapters.index.store import PartitionIndex
from evsched.core.fold import FOLD_VERSION
from evsched.runtime.node.health import NodeHealth
from evsched.runtime.node.lifecycle import TRANSITIONS, InvalidTransition, Phase, check
from evsched.runtime.node.metrics import NodeMetrics
from evsched.runtime.node.node import Node, NodeConfig
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import open_index, restore
from evsched.settings import Settings
from evsched.testing import MemoryBroker, MemoryOutbox, MemoryPartitionLog
from tests.prometheus import parse, value
from tests.unit.runtime.projection.test_restore import history, write_foreign_version


def test_every_phase_can_end_closed_and_moves_outside_the_table_raise() -> None:
    for phase in Phase:
        reachable, frontier = {phase}, [phase]
        while frontier:
            for following in TRANSITIONS[frontier.pop()]:
                if following not in reachable:
                    reachable.add(following)
                    frontier.append(following)
        assert Phase.CLOSED in reachable or phase is Phase.CLOSED, phase
    check(1, None, Phase.ASSIGNED)
    with pytest.raises(
        InvalidTransition, match="partition 1: no transition from unknown to opening"
    ):
        check(1, None, Phase.OPENING)
    health = NodeHealth()
    health.assigned([0])
    health.move(0, Phase.OPENING)
    health.move(0, Phase.CATCHING_UP)
    with pytest.raises(InvalidTransition, match="from catching_up to opening"):
        health.move(0, Phase.OPENING)  # an open partition is never reopened
    health.move(0, Phase.FENCED)
    assert not health.retry_due(0)  # fenced: waits for the next assignment, never retried
    health.closed(0)
    health.assigned([0])
    assert health.phase(0) is Phase.ASSIGNED


class GroupConsumer:
    """The node's group consumer as the open path uses it: pauses, seeks, the group's offset;
    partition 0 assigned."""

    def __init__(self, committed: int | None, log: MemoryPartitionLog) -> None:
        self.committed_offset = committed
        self.log = log
        self.paused: set[int] = set()
        self.seeks: list[tuple[int, int]] = []

    def assignment(self) -> set[int]:
        return {0}

    def pause(self, partition: int) -> None:
        self.paused.add(partition)

    def seek(self, partition: int, offset: int) -> None:
        self.seeks.append((partition, offset))

    async def committed(self, partition: int) -> int | None:
        return self.committed_offset

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return {p: self.log.first[p] for p in partitions}


def node_over(
    tmp_path: Path, log: MemoryPartitionLog, committed: int | None
) -> tuple[Node, GroupConsumer, list[tuple[int, int | None, int]]]:
    """A node whose rebuilds read ``log``; its open records the index it would run on, with a
    producer of the in-memory broker when it was started beforehand (a restored index's)."""
    config = NodeConfig(settings=Settings(namespace="ns"), node_id="n", data_dir=tmp_path / "n")
    node = Node(config, NodeMetrics.create())
    node.restores.open_log = lambda partition: log
    node.restores.open_state = lambda partition: MemoryPartitionLog("ns.state")  # empty
    consumer = GroupConsumer(committed, log)
    node._consumer = consumer  # type: ignore[assignment]
    opened: list[tuple[int, int | None, int]] = []

    async def fake_open(
        _: object, index: PartitionIndex, plan: object = None, started: MemoryOutbox | None = None
    ) -> None:
        opened.append((index.partition, index.fold_version(), index.applied_offset()))
        index.close()
        if started is not None:
            await started.close()
        node.health.move(index.partition, Phase.CATCHING_UP)

    async def start_outbox(partition: int) -> MemoryOutbox:
        outbox = MemoryOutbox(MemoryBroker(), config.transactional_id(partition))
        await outbox.start()
        return outbox

    node.opener.open = fake_open  # type: ignore[method-assign,assignment]
    node._start_outbox = start_outbox  # type: ignore[method-assign,assignment]
    return node, consumer, opened


async def poll_until(node: Node, consumer: GroupConsumer, until: Callable[[], bool]) -> None:
    """Run the poll loop's passes that reopen partitions (under the node's lock) until ``until()``
    holds: a restored partition opens there, once its producer has started."""
    async with asyncio.timeout(10):
        while not until():
            async with node.lock:
                await node._adopt_orphans(consumer)  # type: ignore[arg-type]
            await asyncio.sleep(0.01)


async def foreign_index(tmp_path: Path, log: MemoryPartitionLog) -> None:
    """A node's index of partition 0, folded from ``log`` by another fold version."""
    index = open_index(tmp_path / "n", 0)
    await log.start()
    await restore(log, {0: Projector(index)})
    index.close()
    write_foreign_version(tmp_path / "n", 0, FOLD_VERSION + 1)


async def test_a_foreign_index_is_rebuilt_up_to_the_group_offset_then_opened(
    tmp_path: Path,
) -> None:
    log = MemoryPartitionLog(partitions=1)
    history(log)
    await foreign_index(tmp_path, log)
    node, consumer, opened = node_over(tmp_path, log, committed=9)
    with capture_logs() as logs:
        await node.assign([0])
        assert node.health.phase(0) is Phase.RESTORING and 0 in consumer.paused
        ready, text = node.health.readiness()
        assert not ready and "partition 0 restoring: rebuilding its index" in text
        await poll_until(node, consumer, lambda: bool(opened))
    # Folded up to the group's offset only: the owner folds (and sends) what comes after.
    assert opened == [(0, FOLD_VERSION, 8)]
    assert consumer.seeks == [(0, 9)]
    assert node.health.phase(0) is Phase.CATCHING_UP
    rebuilt = [e for e in logs if e["event"] == "partition_index_rebuilt"]
    assert len(rebuilt) == 1 and rebuilt[0]["partition"] == 0 and rebuilt[0]["records"] == 7
    assert (rebuilt[0]["old_version"], rebuilt[0]["new_version"]) == (
        FOLD_VERSION + 1,
        FOLD_VERSION,
    )
    assert node.metrics is not None
    samples = parse(generate_latest(node.metrics.folded.registry).decode())
    assert value(samples, "evsched_node_index_rebuilds_total", reason="fold_version") == 1


async def test_a_rebuild_that_would_lose_history_is_refused_loudly_and_not_retried_soon(
    tmp_path: Path,
) -> None:
    log = MemoryPartitionLog(partitions=1)
    history(log)
    await foreign_index(tmp_path, log)
    log.trim(0, 4)  # retention deleted offsets 0..3 since
    node, _, opened = node_over(tmp_path, log, committed=9)
    with capture_logs() as logs:
        await node.assign([0])
        async with asyncio.timeout(10):
            while node.health.phase(0) is Phase.RESTORING:
                await asyncio.sleep(0.01)
    assert opened == [] and node.health.phase(0) is Phase.FAILED
    refused = [e for e in logs if e["event"] == "partition_index_rebuild_refused"]
    assert len(refused) == 1 and refused[0]["log_level"] == "error"
    assert "starts at offset 4" in refused[0]["reason"] and "p0000" in refused[0]["fix"]
    ready, text = node.health.readiness()
    assert not ready and "partition 0 failing: its index cannot be rebuilt" in text
    assert not node.health.retry_due(0)  # a slow schedule: minutes, not seconds
    assert node.metrics is not None
    samples = parse(generate_latest(node.metrics.folded.registry).decode())
    assert value(samples, "evsched_node_index_rebuilds_total", reason="fold_version") == 0
    assert value(samples, "evsched_node_partition_failing", partition="0") == 1


class StalledLog(MemoryPartitionLog):
    """A log whose reader never finishes starting (a broker that does not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.starting = asyncio.Event()  # set once the rebuild is waiting on the broker

    async def start(self) -> None:
        self.starting.set()
        await asyncio.Event().wait()


async def test_a_revoke_cancels_a_rebuild_under_way(tmp_path: Path) -> None:
    log = MemoryPartitionLog(partitions=1)
    history(log)
    await foreign_index(tmp_path, log)
    stalled = StalledLog()
    node, _, opened = node_over(tmp_path, stalled, committed=9)
    await node.assign([0])
    task = node.restores.tasks[0]
    await asyncio.wait_for(stalled.starting.wait(), 10)
    assert not task.done() and node.health.phase(0) is Phase.RESTORING
    await node.revoke([0])
    assert task.cancelled() and node.restores.tasks == {}
    assert node.health.phase(0) is Phase.CLOSED and opened == []
    assert node.health.readiness()[0] is True  # not ours any more: not a problem of this node


async def test_an_assignment_plans_every_partition_with_one_changelog_reader(
    tmp_path: Path,
) -> None:
    log = MemoryPartitionLog(partitions=3)
    node, _, opened = node_over(tmp_path, log, committed=None)
    readers: list[list[int]] = []

    def open_state(partitions: Collection[int]) -> MemoryPartitionLog:
        readers.append(sorted(partitions))
        return MemoryPartitionLog("ns.state", partitions=3)  # empty

    node.restores.open_state = open_state
    await node.assign([0, 1, 2])
    assert readers == [[0, 1, 2]]
    assert sorted(p for p, _, _ in opened) == [0, 1, 2]
