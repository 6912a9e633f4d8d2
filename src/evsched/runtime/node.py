"""The node: owns events partitions through a consumer group, folds them and runs the scheduler.

Kafka's group assignment is the ownership: there is no election of our own. Each owned partition
gets a transactional producer whose id is bound to the partition, so a new owner's producer fences
a zombie's, and the fold rejects whatever a zombie still manages to write. Each assigned partition
goes through the phases of ``runtime.lifecycle``; one whose index another fold version built is
rebuilt from the log (``runtime.restore``) before it opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import traceback
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from evsched.adapters.clock import SYSTEM_CLOCK, now_ms
from evsched.adapters.index import PartitionIndex
from evsched.adapters.kafka_events import KafkaGroupConsumer
from evsched.adapters.kafka_groups import GroupOwners
from evsched.adapters.kafka_outbox import KafkaOutbox
from evsched.adapters.signing import DispatchKey
from evsched.adapters.topics import Topics
from evsched.core.planner import PlannerLimits
from evsched.errors import BrokerUnavailable, Fenced, IndexVersionMismatch, PartitionRevoked
from evsched.metrics import Metrics, NodeInstruments
from evsched.runtime.budget import QueueBudget
from evsched.runtime.changelog import ChangelogWriter
from evsched.runtime.changelog_restore import Action, OpenPlan
from evsched.runtime.dispatch_topics import QueueTopics
from evsched.runtime.health import NodeHealth
from evsched.runtime.index_threads import IndexThreads, seek_to_index
from evsched.runtime.lifecycle import Phase
from evsched.runtime.node_restore import IndexRestores, kafka_reader
from evsched.runtime.openings import Openings, opened_side_by_side
from evsched.runtime.outbox_starts import OutboxStarts
from evsched.runtime.ownership import Holder, Ownership
from evsched.runtime.partition import OwnedPartition
from evsched.runtime.runner import PartitionRunner
from evsched.runtime.standby import Standby, kafka_standby, unowned
from evsched.runtime.startup import until_broker
from evsched.runtime.waiting import WaitingForWorker
from evsched.settings import Settings

log = structlog.get_logger("evsched.node")

# How long the poll loop waits after a fetch failed before it fetches again.
POLL_RETRY_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeConfig:
    settings: Settings
    node_id: str
    data_dir: Path
    limits: PlannerLimits = field(default_factory=PlannerLimits)
    max_idle_ms: int = 200
    max_records: int = 2_000
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    dispatch_key: DispatchKey | None = None  # None: dispatch records go out unsigned
    standby: bool = False  # keep warm indexes of the partitions this node does not own
    standby_partitions: frozenset[int] | None = None  # of those, only these (None: all)

    @property
    def group_id(self) -> str:
        return Topics(self.settings.namespace).node_group

    def transactional_id(self, partition: int) -> str:
        return f"{self.settings.namespace}.node.p{partition}"


class Node:
    """Run with ``await node.run(stop)``; returns once ``stop`` is set and partitions closed."""

    def __init__(self, config: NodeConfig, metrics: NodeMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.topics = Topics(config.settings.namespace)
        self.owned: dict[int, PartitionRunner] = {}
        if metrics is not None:  # read at scrape time
            metrics.node.watch_owned(lambda: list(self.owned))
        self._lock = asyncio.Lock()
        self.queue_topics = QueueTopics(config.settings)
        self._consumer: KafkaGroupConsumer | None = None
        self.group_owners = GroupOwners(config.settings)
        self.ownership = Ownership(
            self.group_owners,
            group_id=config.group_id,
            topic=self.topics.events,
            member_id=lambda: None if self._consumer is None else self._consumer.member_id(),
        )
        self._generation = 0  # bumped on every assignment change
        self._rebalancing = False  # between the group's revoke and assign callbacks
        self.budget = QueueBudget()  # --max-in-flight and --max-unstarted hold per node
        self.standby: Standby | None = None  # --standby: started with the consumer
        self.log = log.bind(node_id=config.node_id)
        self.health = NodeHealth(None if metrics is None else metrics.node.failing, logger=self.log)
        self.threads = IndexThreads()  # index opens and closes, off the event loop
        self.openings = Openings(self.health, self._open_failed, self.log)  # outside callbacks
        client_id = f"evsched-node-{config.node_id}"
        self.restores = IndexRestores(
            kafka_reader(config.settings, self.topics.events, client_id),
            open_state=kafka_reader(config.settings, self.topics.state, client_id),
            data_dir=config.data_dir,
            health=self.health,
            counter=None if metrics is None else metrics.node.index_rebuilds,
            log=self.log,
            done=self._restored,
            threads=self.threads,
        )
        # Looked up at each start, not bound now: tests replace _start_outbox.
        self.outbox_starts = OutboxStarts(
            lambda p: self._start_outbox(p),  # noqa: PLW0108
            logger=self.log,
        )

    async def run(self, stop: asyncio.Event) -> None:
        consumer = await until_broker(self._start_consumer, what="events consumer", stop=stop)
        if consumer is None:
            return  # stopped before the broker answered
        self.log.info("node_started", group_id=self.config.group_id)
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
            async with self._lock:
                await self._close_all()
            await self.threads.stop()
            await consumer.close()
            await self.group_owners.close()
            if self.standby is not None:
                await self.standby.stop()
            self.log.info("node_stopped")

    async def _start_standby(self, consumer: KafkaGroupConsumer, stop: asyncio.Event) -> None:
        """Hold every partition not assigned here as a standby copy (``runtime.standby``)."""
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
            )

        started = await until_broker(start, what="standby reader", stop=stop)
        if started is None:
            return
        async with self._lock:  # not while the group assigns: its partitions are not ours
            self.standby, count = started
            mine = set(consumer.assignment()) | set(self.owned) | set(self.health.phases())
            await self.standby.hold(unowned(count, mine))

    async def _start_consumer(self) -> KafkaGroupConsumer:
        consumer = KafkaGroupConsumer(
            self.config.settings,
            self.topics.events,
            group_id=self.config.group_id,
            client_id=f"evsched-node-{self.config.node_id}",
            max_records=self.config.max_records,
            listener=_Rebalance(self),
        )
        self._consumer = consumer  # the group may assign partitions before start() returns
        try:
            await consumer.start()
        except BaseException:
            self._consumer = None
            raise
        return consumer

    async def _poll_once(self, consumer: KafkaGroupConsumer) -> None:
        """Fetch, and hand each partition's records to its runner; never waits for a step."""
        generation = self._generation
        batches = await consumer.read_all(self.config.max_idle_ms / 1000, self.config.max_records)
        if generation != self._generation:
            # The assignment changed while we fetched: these records may predate our seeks.
            # Drop them and fetch again from exactly where each partition's runner stands.
            async with self._lock:
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
        async with self._lock:
            await self._adopt_orphans(consumer)

    async def _adopt_orphans(self, consumer: KafkaGroupConsumer) -> None:
        """Reopen assigned partitions that failed (to open, to step) once their wait is over.

        Never while the group rebalances: until the new assignment is set, the consumer still
        lists the old one, and reopening a partition just revoked would start its producer and
        fence the partition's new owner. The producer starts first, beside this loop
        (``runtime.outbox_starts``): the partition reopens on a later pass, once it has.
        """
        if self._rebalancing:
            return
        for partition in consumer.assignment():
            if partition not in self.owned and self.health.retry_due(partition):
                started = self.outbox_starts.take(partition)
                if started is not None:
                    await self._reopen(consumer, partition, outbox=started)

    async def _reopen(
        self,
        consumer: KafkaGroupConsumer,
        partition: int,
        plan: OpenPlan | None = None,
        *,
        outbox: KafkaOutbox | Exception | None = None,
    ) -> None:
        """Open the partition again; by ``plan`` when one was just made, else planned anew;
        with ``outbox`` when its producer was started already (or why it did not start)."""
        if isinstance(outbox, Exception):
            self.health.move(partition, Phase.OPENING)
            self._open_failed(partition, outbox)
            return
        if (index := await self._index(consumer, partition)) is None:
            await _unused(outbox)
            return
        try:
            [planned] = [plan] if plan is not None else await self.restores.plans(consumer, [index])
            await self._open(consumer, index, planned, outbox)
        except Exception as exc:
            self._open_failed(partition, exc)

    def _open_failed(self, partition: int, exc: Exception) -> None:
        # Left unowned (and paused): the poll loop retries it, later each time.
        failures = self.health.failed(partition, f"open failed: {exc!r}")
        self.log.warning(
            "partition_open_failed", partition=partition, error=repr(exc), failures=failures
        )

    async def _run_partition(
        self, consumer: KafkaGroupConsumer, runner: PartitionRunner, *, seed: bool = False
    ) -> None:
        """Step one partition whenever it has records or its next wake time comes.

        Each owned partition runs on its own, so a due lease waits for its own partition's
        transaction only, never for another partition's fold or round trips. ``seed``: write the
        index to the changelog first, here rather than in the rebalance, which must not wait for
        it; no step runs before it is done (the records fetched meanwhile wait in the inbox).
        """
        owner = runner.owner
        try:
            if seed:
                await self.restores.seed(owner)
            while not runner.closing:
                await runner.wait(self._wait_s(owner))
                if runner.closing:
                    return
                # Position before records: a fetch landing in between can only make the
                # "caught up" test late, never early.
                position = await consumer.position(owner.partition)
                records = runner.take(self.config.max_records)
                now = now_ms()
                if owner.has_work(records, now):
                    await owner.step(records, now, position)
                    self.health.stepped(owner.partition, caught_up=owner.caught_up)
        except PartitionRevoked:
            return  # revoked while we fetched; the listener closes it
        except Fenced as exc:
            if runner.closing:
                return  # revoked meanwhile: the revoke closes it
            reason = str(exc)
            traceback.clear_frames(exc.__traceback__)  # index handles: see below
            await self._fenced(consumer, runner, reason)
        except Exception as exc:
            if runner.closing:
                return  # revoked meanwhile: the revoke closes it
            # Anything else (broker trouble, a producer that must be recreated): drop the
            # partition's in-memory work; _adopt_orphans reopens it from its index, which
            # stays consistent with the log, after a wait that grows while it keeps failing.
            failures = self.health.failed(owner.partition, f"step failed: {exc!r}")
            self.log.warning(
                "partition_step_failed",
                partition=owner.partition,
                error=repr(exc),
                failures=failures,
                retry_in_s=self.health.retry_in_s(owner.partition),
            )
            self._dropped("error")
            # The exception's frames may hold index handles (a scan, a write batch): RocksDB
            # would keep its lock and the reopen fail with "No locks available".
            traceback.clear_frames(exc.__traceback__)
            del exc
            await self._drop(runner)

    async def _fenced(
        self, consumer: KafkaGroupConsumer, runner: PartitionRunner, reason: str
    ) -> None:
        """The partition's producer was fenced: by a new owner, or by the broker aborting a
        transaction that outlived its timeout (``runtime.ownership``). The group says which."""
        partition = runner.owner.partition
        with contextlib.suppress(PartitionRevoked, BrokerUnavailable):
            consumer.pause(partition)  # its runner steps no more; a reopen resumes it
        holder = await self.ownership.settle(partition, runner)
        if holder is None:
            return  # revoked while asking: the revoke closes it
        self.log.warning("partition_fenced", partition=partition, holder=holder.value)
        if holder is Holder.ANOTHER:
            # Reopening would fence the new owner back: wait for the revoke instead.
            self.health.move(partition, Phase.FENCED)
            self._dropped("fenced")
        else:
            # Nobody else has it: what the aborted transaction held never reached the log, and
            # _adopt_orphans reopens the partition with a new producer from its index and the
            # committed offset, as a restart would; it decides again from there.
            self.health.failed(partition, f"transaction lost, still the owner: {reason}")
            self._dropped("transaction_lost")
        await self._drop(runner)

    def _dropped(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.node.dropped.labels(reason).inc()

    def _wait_s(self, owner: OwnedPartition) -> float:
        """Sleep no longer than until the partition's next due time, and at most max_idle_ms."""
        wait_ms = self.config.max_idle_ms
        wake = owner.next_wake_at()
        if wake is not None:
            wait_ms = min(wait_ms, wake - now_ms())
        return max(0, wait_ms) / 1000

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
        busy = set(self.owned) | self.openings.opening()
        opening = [p for p in partitions if p not in busy]
        for partition in opening:
            consumer.pause(partition)
        return opening

    async def assign(self, partitions: Iterable[int]) -> None:
        """Take an assignment and open it (the group's callback leaves the opens to a task)."""
        await self._open_assigned(self.assigned(partitions))

    async def _open_assigned(self, partitions: list[int]) -> None:
        consumer = self._consumer
        assert consumer is not None
        if self.standby is not None:  # closed before any of them opens as owned
            async with self._lock:  # not while _start_standby holds copies
                await self.standby.release(partitions)
        # Each index opens on a thread, side by side (``index_threads.seek_to_index``).
        opening = [self._index(consumer, p) for p in partitions]
        indexes = await opened_side_by_side(opening, self.threads.close)
        try:
            plans = await self.restores.plans(consumer, indexes)
        except BaseException:  # cancelled (a revoke): no index is left open
            await asyncio.gather(*(self.threads.close(index) for index in indexes))
            raise
        # Side by side: each partition waits on its own producer's start (which aborts a killed
        # owner's open transaction) and offset round trips; in turn, a take-over of n
        # partitions took n times as long (issue 9, F.19).
        await asyncio.gather(
            *(self._open_logged(consumer, i, p) for i, p in zip(indexes, plans, strict=True))
        )

    async def _open_logged(
        self, consumer: KafkaGroupConsumer, index: PartitionIndex, plan: OpenPlan | BaseException
    ) -> None:
        try:
            await self._open(consumer, index, plan)
        except Exception as exc:
            self._open_failed(index.partition, exc)

    async def _index(self, consumer: KafkaGroupConsumer, partition: int) -> PartitionIndex | None:
        """The partition's index, paused and sought (None: a rebuild started, or it failed)."""
        self.health.move(partition, Phase.OPENING)
        try:
            return await seek_to_index(self.threads, consumer, self.config.data_dir, partition)
        except IndexVersionMismatch as exc:
            self.restores.start(consumer, partition, _rebuilding(exc))
        except Exception as exc:
            self._open_failed(partition, exc)
        return None

    async def _restored(
        self, consumer: KafkaGroupConsumer, partition: int, plan: OpenPlan | None
    ) -> None:
        """The partition's index was rebuilt: open it, unless it was revoked meanwhile."""
        async with self._lock:
            if self.health.phase(partition) is Phase.RESTORING:
                await self._reopen(consumer, partition, plan)

    async def revoke(self, partitions: Iterable[int]) -> None:
        self._generation += 1
        partitions = list(partitions)
        await self.outbox_starts.cancel(partitions)
        await self.openings.cancel(partitions)  # first: each undoes what it opened
        for partition in partitions:
            await self.restores.cancel(partition)
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
        await self._close(runner.owner)
        self.log.info("partition_revoked", partition=runner.owner.partition, **runner.owner.stats)

    async def _open(
        self,
        consumer: KafkaGroupConsumer,
        index: PartitionIndex,
        plan: OpenPlan | BaseException,
        started: KafkaOutbox | None = None,
    ) -> None:
        """Run the partition on its (open) index as planned; ``plan`` may be why none was made.
        ``started``: its outbox, started already (else started here)."""
        partition = index.partition
        outbox = started
        owner: OwnedPartition | None = None
        # Of another fold version, behind the log's start, or far behind the changelog.
        if not isinstance(plan, BaseException) and plan.action is not Action.USE_LOCAL:
            await self.threads.close(index)
            await _unused(outbox)
            self.restores.start(consumer, partition, f"index: {plan.action.value}", plan)
            return
        try:
            if isinstance(plan, BaseException):
                raise plan
            if outbox is None:
                outbox = await self._start_outbox(partition)
            committed = await consumer.committed(partition)
            end = (await consumer.end_offsets([partition]))[partition]
            owner = self._owner(index, outbox, committed, end)
            runner = PartitionRunner(owner, consumer)
            owner.on_wake = runner.kick
            consumer.seek(partition, runner.fetched_to)
            consumer.resume(partition)
        except BaseException:
            # Whatever failed, the index is closed (its lock released) before a retry reopens it.
            if owner is not None:
                owner.leave()  # the node's budget
            if outbox is not None:
                await outbox.close()
            await self.threads.close(index)
            raise
        self.owned[partition] = runner
        if self.standby is not None:
            self.standby.took_over(partition, owner.resume_offset, end)
        self.health.move(partition, Phase.CATCHING_UP)
        runner.start(self._run_partition(consumer, runner, seed=plan.seed))
        self.log.info(
            "partition_assigned",
            partition=partition,
            resume_offset=owner.resume_offset,
            committed=committed,
            end_offset=end,
        )

    async def _start_outbox(self, partition: int) -> KafkaOutbox:
        """The partition's transactional outbox, started: this fences any older one."""
        outbox = KafkaOutbox(
            self.config.settings,
            client_id=f"evsched-node-{self.config.node_id}-p{partition}",
            transactional_id=self.config.transactional_id(partition),
        )
        await outbox.start()
        return outbox

    def _owner(
        self, index: PartitionIndex, outbox: KafkaOutbox, committed: int | None, end: int
    ) -> OwnedPartition:
        metrics = self.metrics
        return OwnedPartition(
            index=index,
            topics=self.topics,
            outbox=outbox,
            clock=SYSTEM_CLOCK,
            group_id=self.config.group_id,
            node_id=self.config.node_id,
            limits=self.config.limits,
            committed=committed,
            end_offset=end,
            ensure_queues=self.queue_topics.ensure,
            on_commit=None if metrics is None else metrics.folded.observe_commit,
            instruments=None if metrics is None else metrics.node.partition(index.partition),
            budget=self.budget,
            dispatch_key=self.config.dispatch_key,
            changelog=ChangelogWriter(self.topics.state, index.partition),
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
        await self.threads.close(owner.index)

    async def _close_all(self) -> None:
        starting = self.outbox_starts.starting()
        await self.revoke(sorted(set(self.owned) | set(self.health.phases()) | starting))


async def _unused(outbox: KafkaOutbox | Exception | None) -> None:
    """Close a started outbox the partition will not use (nothing else to do otherwise)."""
    if outbox is not None and not isinstance(outbox, Exception):
        await outbox.close()


def _rebuilding(mismatch: IndexVersionMismatch) -> str:
    return (
        f"rebuilding its index from the log (fold version {mismatch.found} -> {mismatch.expected})"
    )


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    """A node's Prometheus instruments: what it folds (verdicts, lateness) and what it does."""

    folded: Metrics
    node: NodeInstruments
    waiting: WaitingForWorker

    @classmethod
    def create(cls) -> NodeMetrics:
        # A node folds only the partitions it owns: no jobs-by-status gauge (the API has it).
        folded = Metrics(job_counts=False)
        waiting = WaitingForWorker(folded.registry)
        folded.followers.append(waiting.observe)
        return cls(folded=folded, node=NodeInstruments(folded.registry), waiting=waiting)


class _Rebalance:
    """Closes what the group revokes before it returns; starts opening what it assigns."""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def revoked(self, partitions: list[int]) -> None:
        # Called at the start of every rebalance (with nothing on the first join).
        self.node._rebalancing = True
        async with self.node._lock:
            await self.node.revoke(partitions)
            if self.node.standby is not None:  # followed again, as a standby copy
                await self.node.standby.hold(partitions)

    async def assigned(self, partitions: list[int]) -> None:
        # No await: aiokafka heartbeats again only once this returns (``runtime.openings``).
        try:
            node = self.node
            node.openings.start(node.assigned(partitions), node._open_assigned)
        finally:
            self.node._rebalancing = False
