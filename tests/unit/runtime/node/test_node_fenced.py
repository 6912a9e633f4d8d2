"""A node whose partition's producer is fenced, without a broker: the group's assignment decides
whether a new owner took the partition (wait for the revoke) or the broker only aborted the
transaction (``transaction.timeout.ms`` during a long outage: reopen from the index and the
committed offset, decide again, and nothing of the aborted transaction counts)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from evsched.adapters import avro
from evsched.core.events import Event, JobLeased, entity_id
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Status
from evsched.errors import BrokerUnavailable
from evsched.ports import ConsumerOffset, Holdback, Outgoing, Record
from evsched.runtime.node import health, ownership
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.metrics import NodeMetrics
from evsched.runtime.node.node import Node, NodeConfig
from evsched.runtime.node.ownership import Holder, Ownership
from evsched.runtime.projection.changelog import Meta, latest_meta
from evsched.runtime.projection.changelog_restore import Action, local_index, plan_open
from evsched.settings import Settings
from evsched.testing import MemoryBroker, MemoryOutbox
from evsched.testing.driver import every_queue_declared
from tests.prometheus import parse, value
from tests.unit.node_driver_events import enqueued

ME = "evsched-node-n-1f2e"  # this node's member id in the group
OTHER = "evsched-node-m-9a8b"


class AbortedOutbox(MemoryOutbox):
    """A partition's outbox whose transaction deciding a job in ``abort`` never commits.

    Its epoch is bumped first, as the transaction coordinator does when it aborts a transaction
    past ``transaction.timeout.ms`` (aiokafka then reports InvalidProducerEpoch as
    ProducerFenced, the outbox ``Fenced``), and as a new owner's producer does when it starts.
    """

    def __init__(self, broker: MemoryBroker, transactional_id: str, abort: set[str]) -> None:
        super().__init__(broker, transactional_id)
        self.abort = abort

    async def send(
        self, outgoing: Sequence[Outgoing], *, offset: ConsumerOffset | None, holdback: Holdback
    ) -> list[Outgoing]:
        doomed = {o.decision for o in outgoing} & self.abort
        if doomed:
            self.abort -= doomed
            self.broker.claim(self.transactional_id)
        return await super().send(outgoing, offset=offset, holdback=holdback)


class Group:
    """The nodes' group as its coordinator answers: scripted answers first, then ``holders``."""

    def __init__(self, holders: dict[int, str]) -> None:
        self.holders = holders
        self.script: list[dict[int, str] | Exception] = []
        self.asks = 0

    async def members(self, group_id: str, topic: str) -> dict[int, str]:
        self.asks += 1
        if self.script:
            answer = self.script.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return dict(self.holders)


class GroupConsumer:
    """The node's group consumer over a MemoryBroker: one member holding ``assigned``."""

    def __init__(self, broker: MemoryBroker, topic: str, group_id: str, assigned: set[int]) -> None:
        self.broker = broker
        self.topic = topic
        self.group_id = group_id
        self.assigned = assigned
        self.paused: set[int] = set()
        self.positions: dict[int, int] = {}

    def member_id(self) -> str | None:
        return ME

    def assignment(self) -> set[int]:
        return set(self.assigned)

    def pause(self, partition: int) -> None:
        self.paused.add(partition)

    def resume(self, partition: int) -> None:
        self.paused.discard(partition)

    def seek(self, partition: int, offset: int) -> None:
        self.positions[partition] = offset

    async def position(self, partition: int) -> int:
        return self.positions.get(partition, 0)

    async def committed(self, partition: int) -> int | None:
        return self.broker.committed(self.group_id, self.topic, partition)

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return {p: 0 for p in partitions}

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return {p: self.broker.end_offset(self.topic, p) for p in partitions}

    def fetch(self) -> dict[int, list[Record]]:
        """What the poll loop's read returns: new records of each unpaused partition."""
        found: dict[int, list[Record]] = {}
        for partition in self.assigned - self.paused:
            records = self.broker.records(self.topic, partition, self.positions.get(partition, 0))
            if records:
                found[partition] = records
            self.positions[partition] = self.broker.end_offset(self.topic, partition)
        return found


class Rig:
    """A real Node (partition runners, lifecycle, fold, index) over in-memory twins."""

    def __init__(self, tmp_path: Path, group: Group) -> None:
        config = NodeConfig(settings=Settings(namespace="ns"), node_id="n", data_dir=tmp_path)
        self.node = Node(config, NodeMetrics.create())
        self.broker = MemoryBroker()
        self.topic = self.node.topics.events
        self.consumer = GroupConsumer(self.broker, self.topic, config.group_id, {0})
        self.group = group
        self.outboxes: list[MemoryOutbox] = []
        self.abort: set[str] = set()  # jobs whose lease's transaction is aborted (once)
        node = self.node
        node._consumer = self.consumer  # type: ignore[assignment]
        node.steps.ownership = Ownership(
            group, group_id=config.group_id, topic=self.topic, member_id=self.consumer.member_id
        )
        # The changelog as the outboxes wrote it: a reopen finds its snapshot.
        node.restores.open_state = lambda partitions: self.broker.reader(node.topics.state)
        node.queue_topics.ensure = every_queue_declared  # type: ignore[method-assign]

        async def start_outbox(partition: int) -> MemoryOutbox:
            box = AbortedOutbox(self.broker, config.transactional_id(partition), self.abort)
            await box.start()  # a new epoch: as a new producer's InitProducerId
            self.outboxes.append(box)
            return box

        node._start_outbox = start_outbox  # type: ignore[method-assign,assignment]

    def append(self, *events: Event) -> None:
        for event in events:
            self.broker.append(
                self.topic, avro.encode_event(event), key=entity_id(event).encode(), partition=0
            )

    def leased(self) -> list[tuple[str, int]]:
        """(job id, token) of every JobLeased that reached the log."""
        found = []
        for record in self.broker.records(self.topic, 0):
            assert record.value is not None
            event = avro.decode_event(record.value)
            if isinstance(event, JobLeased):
                found.append((event.job_id, event.token))
        return found

    async def pump(self, until: Callable[[], bool], timeout_s: float = 10.0) -> None:
        """Run the node's poll loop (fetch, feed, adopt orphans) until ``until()`` holds."""
        node = self.node
        async with asyncio.timeout(timeout_s):
            while not until():
                for partition, records in self.consumer.fetch().items():
                    if (runner := node.owned.get(partition)) is not None:
                        runner.feed(records)
                async with node.lock:
                    await node._adopt_orphans(self.consumer)  # type: ignore[arg-type]
                await asyncio.sleep(0.01)

    async def idle(self, seconds: float) -> None:
        """Run the poll loop for ``seconds`` (retry waits run out meanwhile)."""
        with contextlib.suppress(TimeoutError):
            await self.pump(lambda: False, timeout_s=seconds)

    def dropped(self, reason: str) -> float:
        assert self.node.metrics is not None
        text = generate_latest(self.node.metrics.folded.registry).decode()
        return value(parse(text), "evsched_node_partitions_dropped_total", reason=reason)


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "RETRY_FIRST_S", 0.01)
    monkeypatch.setattr(ownership, "ASK_AGAIN_FIRST_S", 0.01)


async def started(rig: Rig) -> MemoryOutbox:
    """The node owns partition 0 and leased job "a" in it; its outbox."""
    rig.append(enqueued("a"))
    await rig.node.assign([0])
    await rig.pump(lambda: rig.leased() == [("a", 1)])
    return rig.outboxes[-1]


async def test_a_transaction_the_broker_aborted_reopens_the_partition_which_decides_again(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, Group({0: ME}))
    first = await started(rig)
    # The group is rebalancing at the first ask, the coordinator is away at the second: the
    # node asks until it gets an answer.
    rig.group.script = [{}, BrokerUnavailable("coordinator moving")]
    rig.abort.add("b")
    rig.append(enqueued("b"))
    with capture_logs() as logs:
        await rig.pump(lambda: len(rig.leased()) == 2)
        await rig.pump(lambda: rig.node.health.phase(0) is Phase.RUNNING)
    # b's first lease went in the aborted transaction: it never reached the log, and the
    # reopened partition decided it again, once, with the token the fold expects next.
    assert rig.leased() == [("a", 1), ("b", 1)]
    assert len(rig.outboxes) == 2 and first.closed and not rig.outboxes[1].closed
    assert rig.group.asks == 3
    fenced = [e for e in logs if e["event"] == "partition_fenced"]
    assert [(e["partition"], e["holder"]) for e in fenced] == [(0, Holder.THIS_NODE.value)]
    assert any(e["event"] == "partition_recovered" for e in logs)
    assert rig.dropped("transaction_lost") == 1 and rig.dropped("fenced") == 0

    def leased_in_index() -> bool:  # once the lease is read back from the log and folded
        state = rig.node.owned[0].owner.index.job("b")
        return state is not None and state.status is Status.LEASED and state.token == 1

    await rig.pump(leased_in_index)
    assert rig.node.health.readiness()[0] is True
    await rig.node.revoke([0])


async def test_a_partition_another_member_holds_waits_for_its_revoke(tmp_path: Path) -> None:
    rig = Rig(tmp_path, Group({0: ME}))
    first = await started(rig)
    rig.group.holders = {0: OTHER}  # the group moved it; this node has not heard yet
    rig.abort.add("b")  # the new owner's producer took the transactional id
    rig.append(enqueued("b"))
    await rig.pump(lambda: rig.node.health.phase(0) is Phase.FENCED)
    asks = rig.group.asks
    # Never reopened: its producer would fence the new owner back.
    await rig.idle(0.3)
    assert len(rig.outboxes) == 1 and first.closed and 0 not in rig.node.owned
    assert rig.group.asks == asks == 1
    assert rig.leased() == [("a", 1)]
    assert rig.dropped("fenced") == 1 and rig.dropped("transaction_lost") == 0
    await rig.node.revoke([0])
    assert rig.node.health.phase(0) is Phase.CLOSED


async def test_a_revoke_while_the_group_gives_no_answer_closes_the_partition(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, Group({}))  # rebalancing for as long as the test runs
    await rig.node.assign([0])
    await rig.pump(lambda: 0 in rig.node.owned)
    rig.abort.add("a")
    rig.append(enqueued("a"))
    await rig.pump(lambda: rig.group.asks >= 3)
    await rig.node.revoke([0])  # the rebalance's revoke: the ask loop ends, the revoke closes
    assert rig.node.health.phase(0) is Phase.CLOSED and rig.node.owned == {}
    assert len(rig.outboxes) == 1 and rig.outboxes[0].closed
    assert rig.leased() == []


async def test_a_revoke_flushes_the_changelog_up_to_the_index(tmp_path: Path) -> None:
    """The next owner then writes the changelog on from the index as it is (no restore)."""
    rig = Rig(tmp_path, Group({0: ME}))
    await started(rig)
    rig.append(enqueued("b"))  # folded by a step whose flush is not due (1 s later)
    await rig.pump(lambda: len(rig.leased()) == 2)
    await rig.node.revoke([0])
    local = local_index(tmp_path, 0)
    meta = await latest_meta(rig.broker.reader(rig.node.topics.state), 0)
    assert meta == Meta(local.applied_offset, FOLD_VERSION) and local.applied_offset >= 2
    plan = plan_open(local, log_start=0, meta=meta, owner=True)
    assert (plan.action, plan.seed) == (Action.USE_LOCAL, False)
