"""The node: owns events partitions through a consumer group, folds them and runs the scheduler.

Kafka's group assignment is the ownership: there is no election of our own. Each owned partition
shares the node's one transactional producer, whose transactions commit every partition's outputs
with offsets the group's generation fences (``adapters.kafka.node_transactions``; with
``EVSCHED_NODE_TRANSACTIONS=partition``, a producer per partition whose id is bound to it, so a
new owner's producer fences a zombie's), and the fold rejects whatever a zombie still manages to
write. Each assigned partition goes through the phases of ``runtime.node.lifecycle``: it opens
(``runtime.node.opener``), or is restored first (``runtime.node.index_restore``), then runs in a
task of its own until it is revoked or fails; the group's callbacks are ``runtime.node.rebalance``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.groups import GroupOwners
from evsched.adapters.kafka.node_transactions import NodeOutbox, NodeTransactions
from evsched.adapters.kafka.partition_log import GroupMembership, KafkaGroupConsumer
from evsched.adapters.kafka.partition_outbox import KafkaOutbox
from evsched.adapters.kafka.rdkafka_group import GroupMember, RdkafkaGroupConsumer
from evsched.adapters.kafka.topics import Topics
from evsched.adapters.kafka.worker_groups import WorkerGroups
from evsched.adapters.proofs import NodeKeyring
from evsched.adapters.signing import DispatchKey
from evsched.core.planner import PlannerBudgets
from evsched.errors import BrokerUnavailable, PartitionRevoked
from evsched.runtime.node.dispatch_topics import QueueTopics
from evsched.runtime.node.health import NodeHealth
from evsched.runtime.node.index_restore import IndexRestores, kafka_reader
from evsched.runtime.node.lifecycle import Phase
from evsched.runtime.node.metrics import NodeMetrics
from evsched.runtime.node.opener import PartitionOpener
from evsched.runtime.node.ownership import Ownership
from evsched.runtime.node.rebalance import NodeRebalance
from evsched.runtime.node.standby import Standby, kafka_standby, unowned
from evsched.runtime.node.steps import PartitionSteps
from evsched.runtime.partition.budget import QueueBudget
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.partition.presence import WorkerPresence
from evsched.runtime.partition.runner import PartitionRunner
from evsched.runtime.process.startup import until_broker
from evsched.runtime.projection.changelog import ChangelogWriter
from evsched.runtime.projection.changelog_restore import OpenPlan
from evsched.runtime.projection.index_threads import IndexThreads
from evsched.settings import Settings, SettingsError

log = structlog.get_logger("evsched.node")

# How long the poll loop waits after a fetch failed before it fetches again.
POLL_RETRY_S = 1.0
# At most one step per partition this often: under load a step's transaction carries more
# records (less broker and node CPU per job, shorter tails on a busy box; docs/bench-log.md);
# a partition idle for longer steps at once.
STEP_INTERVAL_MS = 20
# "tick" (the default): one transaction per node tick (NodeConfig.tick_transactions);
# "partition": a transactional producer per partition, the opt-out kept for one release.
TRANSACTIONS_ENV = "EVSCHED_NODE_TRANSACTIONS"
TRANSACTION_MODES = ("tick", "partition")


def tick_transactions_from_env() -> bool:
    """``EVSCHED_NODE_TRANSACTIONS``: unset or "tick" -> True, "partition" -> False; any other
    value is refused (SettingsError naming the variable)."""
    mode = os.environ.get(TRANSACTIONS_ENV, "").strip() or "tick"
    if mode not in TRANSACTION_MODES:
        expected = ", ".join(TRANSACTION_MODES)
        raise SettingsError(f"{TRANSACTIONS_ENV}={mode!r}: expected one of {expected}")
    return mode == "tick"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    settings: Settings
    node_id: str
    data_dir: Path
    budgets: PlannerBudgets = field(default_factory=PlannerBudgets)
    max_idle_ms: int = 200
    max_records: int = 2_000
    step_interval_ms: int = STEP_INTERVAL_MS  # one step per partition per interval at most
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    dispatch_key: DispatchKey | None = None  # None: dispatch records go out unsigned
    # None: this node's facts go out unproven, and it requires no proofs (adapters.proofs).
    node_keyring: NodeKeyring | None = field(default=None, repr=False)
    standby: bool = False  # keep warm indexes of the partitions this node does not own
    standby_partitions: frozenset[int] | None = None  # of those, only these (None: all)
    # One librdkafka transaction per node tick over every partition, fenced by the group's
    # generation (exactly-once v2, adapters.kafka.node_transactions); False: a transactional
    # producer per partition (aiokafka), EVSCHED_NODE_TRANSACTIONS=partition, for one release.
    tick_transactions: bool = field(default_factory=tick_transactions_from_env)

    @property
    def group_id(self) -> str:
        return Topics(self.settings.namespace).node_group

    def transactional_id(self, partition: int) -> str:
        """A partition's own producer's id (without tick transactions)."""
        return f"{self.settings.namespace}.node.p{partition}"

    @property
    def node_transactional_id(self) -> str:
        """The node's one transactional producer: a restart of this node id fences the last."""
        return f"{self.settings.namespace}.node.{self.node_id}"


class Node:
    """Run with ``await node.run(stop)``; returns once ``stop`` is set and partitions closed."""

    def __init__(self, config: NodeConfig, metrics: NodeMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.topics = Topics(config.settings.namespace)
        self.owned: dict[int, PartitionRunner] = {}
        if metrics is not None:  # read at scrape time
            metrics.node.watch_owned(lambda: list(self.owned))
        self.lock = asyncio.Lock()  # partitions open, close and are adopted one holder at a time
        self.queue_topics = QueueTopics(config.settings)
        self._consumer: GroupMember | None = None
        # Every partition's outputs and offsets, one transaction per tick (exactly-once v2).
        self.transactions = NodeTransactions(
            config.settings,
            transactional_id=config.node_transactional_id,
            client_id=f"evsched-node-{config.node_id}",
            group_metadata=self._group_metadata,
            member_id=lambda: None if self._consumer is None else self._consumer.member_id(),
            checked_queues=self.queue_topics.known,
        )
        self.group_owners = GroupOwners(config.settings)
        self._generation = 0  # bumped on every assignment change
        self.rebalancing = False  # between the group's revoke and assign callbacks
        self.budget = QueueBudget()  # --max-in-flight and --max-unstarted hold per node
        self.log = log.bind(node_id=config.node_id)
        # Which queues have a live worker: only those are leased (runtime.partition.presence).
        self.presence = WorkerPresence(
            WorkerGroups(config.settings),
            SYSTEM_CLOCK,
            logger=self.log,
            ensure_queues=self.queue_topics.ensure,  # an unusable topic is planned, and held
        )
        self.presence.on_gain = self._wake_all
        if metrics is not None:
            metrics.watch_presence(self.presence.waiting, self.presence.workers)
        self.standby: Standby | None = None  # --standby: started with the consumer
        self.health = NodeHealth(None if metrics is None else metrics.node.failing, logger=self.log)
        self.threads = IndexThreads()  # index opens and closes, off the event loop
        self.restores = self._index_restores()
        self.opener = PartitionOpener(
            data_dir=config.data_dir,
            health=self.health,
            threads=self.threads,
            restores=self.restores,
            # Looked up at each start, not bound now: tests replace _start_outbox.
            start_outbox=lambda p: self._start_outbox(p),  # noqa: PLW0108
            make_owner=self._owner,
            opened=self._opened,
            logger=self.log,
        )
        self.steps = self._partition_steps()

    def _index_restores(self) -> IndexRestores:
        config, metrics = self.config, self.metrics
        client_id = f"evsched-node-{config.node_id}"
        return IndexRestores(
            kafka_reader(config.settings, self.topics.events, client_id),
            open_state=kafka_reader(config.settings, self.topics.state, client_id),
            data_dir=config.data_dir,
            health=self.health,
            counter=None if metrics is None else metrics.node.index_rebuilds,
            log=self.log,
            done=self._restored,
            threads=self.threads,
            keyring=config.node_keyring,
        )

    def _partition_steps(self) -> PartitionSteps:
        ownership = Ownership(
            self.group_owners,
            group_id=self.config.group_id,
            topic=self.topics.events,
            member_id=lambda: None if self._consumer is None else self._consumer.member_id(),
        )
        return PartitionSteps(
            restores=self.restores,
            health=self.health,
            ownership=ownership,
            max_records=self.config.max_records,
            max_idle_ms=self.config.max_idle_ms,
            step_interval_ms=self.config.step_interval_ms,
            dropped=None if self.metrics is None else self.metrics.node.dropped,
            drop=self._drop,
            logger=self.log,
        )

    async def run(self, stop: asyncio.Event) -> None:
        consumer = await until_broker(self._start_consumer, what="events consumer", stop=stop)
        if consumer is None:
            return  # stopped before the broker answered
        self.log.info(
            "node_started",
            group_id=self.config.group_id,
            transactions="tick" if self.config.tick_transactions else "partition",
        )
        presence = asyncio.create_task(self.presence.run(stop))
        try:
            if self.config.standby:
                await self._start_standby(consumer, stop)
            while not stop.is_set():
                try:
                    await self._poll_once(consumer)
                except BrokerUnavailable as exc:
                    # The consumer retries connections itself; an error that still reaches us
                    # (an authorization, a broker answer it gave up on) must not end the node.
                    self.log.warning("poll_failed", error=repr(exc), retry_in_s=POLL_RETRY_S)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), POLL_RETRY_S)
        finally:
            presence.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await presence
            async with self.lock:
                await self._close_all()
            await self.threads.stop()
            await self.transactions.close()
            await consumer.close()
            await self.group_owners.close()
            await self.presence.close()
            if self.standby is not None:
                await self.standby.stop()
            self.log.info("node_stopped")

    def _wake_all(self) -> None:
        """A queue gained a worker: its held jobs may be leased now, on any partition."""
        for runner in self.owned.values():
            runner.owner.wake()

    async def _start_standby(self, consumer: GroupMember, stop: asyncio.Event) -> None:
        """Hold every partition not assigned here as a standby copy (``runtime.node.standby``)."""
        gauge = None if self.metrics is None else self.metrics.node.standby_lag

        async def start() -> tuple[Standby, int]:
            return await kafka_standby(
                self.config.settings,
                self.config.group_id,
                self.config.data_dir,
                client_id=f"evsched-node-{self.config.node_id}",
                lag_gauge=gauge,
                logger=self.log,
                only=self.config.standby_partitions,
                keyring=self.config.node_keyring,
            )

        started = await until_broker(start, what="standby reader", stop=stop)
        if started is None:
            return
        async with self.lock:  # not while the group assigns: its partitions are not ours
            self.standby, count = started
            mine = set(consumer.assignment()) | set(self.owned) | set(self.health.phases())
            await self.standby.hold(unowned(count, mine))

    async def _start_consumer(self) -> GroupMember:
        kind = RdkafkaGroupConsumer if self.config.tick_transactions else KafkaGroupConsumer
        member = GroupMembership(
            settings=self.config.settings,
            topic=self.topics.events,
            group_id=self.config.group_id,
            client_id=f"evsched-node-{self.config.node_id}",
            max_records=self.config.max_records,
        )
        consumer: GroupMember = kind(member, listener=NodeRebalance(self))
        if isinstance(consumer, RdkafkaGroupConsumer):
            consumer.fence = self.transactions.fence  # a dead member's open transaction
        self._consumer = consumer  # the group may assign partitions before start() returns
        try:
            await consumer.start()
        except BaseException:
            self._consumer = None
            raise
        return consumer

    async def _poll_once(self, consumer: GroupMember) -> None:
        """Fetch, and hand each partition's records to its runner; never waits for a step."""
        generation = self._generation
        batches = await consumer.read_all(self.config.max_idle_ms / 1000, self.config.max_records)
        if generation != self._generation:
            # The assignment changed while we fetched: these records may predate our seeks.
            # Drop them and fetch again from exactly where each partition's runner stands.
            async with self.lock:
                for partition, runner in self.owned.items():
                    with contextlib.suppress(PartitionRevoked):
                        consumer.seek(partition, runner.fetched_to)
            return
        for partition, records in batches.items():
            if (target := self.owned.get(partition)) is not None:
                target.feed(records)
        # getmany(timeout_ms=0) may return without yielding: let heartbeats, fetches and the
        # partition runners go.
        await asyncio.sleep(0)
        async with self.lock:
            await self._adopt_orphans(consumer)

    async def _adopt_orphans(self, consumer: GroupMember) -> None:
        """Reopen assigned partitions that failed (to open, to step) once their wait is over, and
        open those whose index was restored (``PartitionOpener.adopt``).

        Never while the group rebalances: until the new assignment is set, the consumer still
        lists the old one, and reopening a partition just revoked would start its producer and
        fence the partition's new owner.
        """
        if self.rebalancing:
            return
        unowned = [p for p in consumer.assignment() if p not in self.owned]
        await self.opener.adopt(consumer, unowned)

    # --- ownership ---------------------------------------------------------------------------

    def assigned(self, partitions: Iterable[int]) -> list[int]:
        """Take the group's new assignment as its callback must: at once, without an await.

        Each partition to open (returned) has its fetches held until it is open: a fetch from
        the group's committed offset must never reach the fold.
        """
        consumer = self._consumer
        assert consumer is not None
        self._generation += 1
        partitions = list(partitions)
        self.health.assigned(partitions)
        # Not expected (the revoke closed or cancelled every one and adoption waits for this
        # call), but reopening an open index would fail on its lock and leave it paused.
        busy = set(self.owned) | self.opener.openings.opening()
        opening = [p for p in partitions if p not in busy]
        for partition in opening:
            consumer.pause(partition)
        return opening

    async def assign(self, partitions: Iterable[int]) -> None:
        """Take an assignment and open it (the group's callback leaves the opens to a task)."""
        await self.open_assigned(self.assigned(partitions))

    async def open_assigned(self, partitions: list[int]) -> None:
        """Open an assignment's partitions (in a task of ``Openings``, not the group's callback)."""
        consumer = self._consumer
        assert consumer is not None
        if self.standby is not None:  # closed before any of them opens as owned
            async with self.lock:  # not while _start_standby holds copies
                await self.standby.release(partitions)
        await self.opener.open_assigned(consumer, partitions)

    async def _restored(self, consumer: GroupMember, partition: int, plan: OpenPlan | None) -> None:
        """The partition's index was restored: the poll loop opens it once its producer has
        started (``PartitionOpener.restored``), unless it was revoked meanwhile."""
        async with self.lock:  # never in the middle of a revoke, which gives up its start
            self.opener.restored(partition, plan)

    async def revoke(self, partitions: Iterable[int]) -> None:
        self._generation += 1
        partitions = list(partitions)
        await self.opener.cancel(partitions)
        runners = [r for p in partitions if (r := self.owned.pop(p, None)) is not None]
        for runner in runners:
            self.health.move(runner.owner.partition, Phase.CLOSING)
            runner.close()
        # Side by side: the group's rebalance, and so every take-over, waits for the last one.
        await asyncio.gather(*(self._closed(runner) for runner in runners))
        for partition in partitions:
            self.health.closed(partition)
        if self.metrics is not None:  # their jobs' starts and ends are folded elsewhere now
            self.metrics.waiting.forget(partitions)

    async def _closed(self, runner: PartitionRunner) -> None:
        """Wait for the runner's step in flight, then close its partition (revoked)."""
        await runner.stopped()
        try:  # so the next owner finds the changelog as far as the index (else it restores)
            await runner.owner.flush_changelog()
        except Exception as exc:  # e.g. fenced: the next owner restores from the changelog
            partition = runner.owner.partition
            self.log.warning("changelog_flush_failed", partition=partition, error=repr(exc))
        await self._close(runner.owner)
        self.log.info("partition_revoked", partition=runner.owner.partition, **runner.owner.stats)

    def _opened(
        self,
        consumer: GroupMember,
        runner: PartitionRunner,
        *,
        seed: bool,
        committed: int | None,
        end: int,
    ) -> None:
        """Own and run a partition just opened; ``seed``: its index goes to the changelog first."""
        owner = runner.owner
        self.owned[owner.partition] = runner
        if self.standby is not None:
            self.standby.took_over(owner.partition, owner.resume_offset, end)
        self.health.move(owner.partition, Phase.CATCHING_UP)
        runner.start(self.steps.run(consumer, runner, seed=seed))
        self.log.info(
            "partition_assigned",
            partition=owner.partition,
            resume_offset=owner.resume_offset,
            committed=committed,
            end_offset=end,
        )

    async def _start_outbox(self, partition: int) -> NodeOutbox:
        """The partition's outbox, started: its share of the node's transactions (tick mode), or
        a transactional producer of its own, whose start fences any older one."""
        outbox: NodeOutbox
        if self.config.tick_transactions:
            outbox = self.transactions.for_partition(partition)
        else:
            outbox = KafkaOutbox(
                self.config.settings,
                client_id=f"evsched-node-{self.config.node_id}-p{partition}",
                transactional_id=self.config.transactional_id(partition),
            )
        await outbox.start()
        return outbox

    def _group_metadata(self) -> object:
        consumer = self._consumer
        if not isinstance(consumer, RdkafkaGroupConsumer):
            raise BrokerUnavailable("the node's librdkafka group member is not started")
        return consumer.group_metadata()

    def _owner(
        self, index: PartitionIndex, outbox: NodeOutbox, committed: int | None, end: int
    ) -> OwnedPartition:
        metrics = self.metrics
        return OwnedPartition(
            index=index,
            topics=self.topics,
            outbox=outbox,
            clock=SYSTEM_CLOCK,
            group_id=self.config.group_id,
            node_id=self.config.node_id,
            budgets=self.config.budgets,
            committed=committed,
            end_offset=end,
            ensure_queues=self.queue_topics.ensure,
            on_commit=None if metrics is None else metrics.folded.observe_commit,
            instruments=None if metrics is None else metrics.node.partition(index.partition),
            budget=self.budget,
            dispatch_key=self.config.dispatch_key,
            changelog=ChangelogWriter(
                self.topics.state,
                index.partition,
                interval_ms=self.config.settings.changelog_interval_ms,
            ),
            keyring=self.config.node_keyring,
            presence=self.presence,
            offset_fences=self.config.tick_transactions,
        )

    async def _drop(self, runner: PartitionRunner) -> None:
        """Called by a runner on its way out after an error: release what it held."""
        runner.close()
        if self.owned.get(runner.owner.partition) is runner:
            del self.owned[runner.owner.partition]
            await self._close(runner.owner)

    async def _close(self, owner: OwnedPartition) -> None:
        await owner.outbox.close()
        owner.leave()
        self.presence.forget(owner.partition)
        await self.threads.close(owner.index)

    async def _close_all(self) -> None:
        starting = self.opener.outbox_starts.starting()
        await self.revoke(sorted(set(self.owned) | set(self.health.phases()) | starting))
