"""A node's partition without a broker: Kafka Streams' TopologyTestDriver idea for evsched.

``NodeDriver`` runs the real ``OwnedPartition`` (fold, planner, quarantine, effects with their
offset) over a real RocksDB index in a temporary directory, an in-memory outbox and a frozen
clock. Events appended to the partition's log are encoded with the real Avro codec; what the
outbox commits lands back in that log, as it would in Kafka, and the next step folds it. The
driver holds no planner logic: it only moves records and time.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar, overload

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.topics import Topics
from evsched.adapters.proofs import NodeKeyring
from evsched.adapters.signing import DispatchKey
from evsched.core.dispatch import Dispatch
from evsched.core.events import Event, entity_id
from evsched.core.planner import PlannerBudgets
from evsched.core.state import JobState, ScheduleState, TimelineEntry
from evsched.ports import Record
from evsched.runtime.partition.budget import QueueBudget
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.partition.presence import WorkerPresence
from evsched.runtime.partition.quarantine import EnsureQueues, Unusable
from evsched.runtime.projection.changelog import ChangelogWriter
from evsched.testing.memory import FrozenClock
from evsched.testing.outbox import MemoryBroker, MemoryOutbox

E = TypeVar("E", bound=Event)


async def every_queue_declared(queues: set[str]) -> dict[str, Unusable]:
    """The default queue check: every dispatch topic exists."""
    return {}


class NodeDriver:
    """One owned events partition, stepped by hand: ``append``, ``await step()``, ``advance``.

    ``await settle()`` steps until nothing is left to fold or decide at the clock's time.
    ``crash_after_commit()`` then ``await restart()`` reopen the index from disk as a new owner
    does after a crash: from the group's committed offset, refolding the gap without sending.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        partition: int = 0,
        budgets: PlannerBudgets | None = None,
        namespace: str = "ns",
        clock: FrozenClock | None = None,
        broker: MemoryBroker | None = None,
        max_records: int = 2_000,
        scan_limit: int = 1_000,
        ensure_queues: EnsureQueues = every_queue_declared,
        budget: QueueBudget | None = None,
        dispatch_key: DispatchKey | None = None,
        node_id: str = "driver",
        keyring: NodeKeyring | None = None,
        presence: WorkerPresence | None = None,
        changelog_interval_ms: int | None = 0,
    ) -> None:
        self.data_dir = data_dir
        # How often the changelog is flushed, on the driver's clock: by default at each step
        # (after the step that wrote the index), so a settled driver's changelog is whole; None:
        # a node's (runtime.projection.changelog.FLUSH_INTERVAL_MS).
        self.changelog_interval_ms = changelog_interval_ms
        self.partition = partition
        self.budgets = budgets or PlannerBudgets()
        self.topics = Topics(namespace)
        self.clock = clock or FrozenClock()
        self.broker = broker or MemoryBroker(self.clock)
        self.max_records = max_records
        self.scan_limit = scan_limit
        self.ensure_queues = ensure_queues
        self.budget = budget
        self.dispatch_key = dispatch_key
        self.keyring = keyring  # the node keys: None, this node proves and checks nothing
        self.node_id = node_id
        self.presence = presence  # None: every queue counts as served by a worker
        self.group_id = Topics(namespace).node_group
        self.transactional_id = f"{namespace}.node.p{partition}"
        self.outbox = MemoryOutbox(self.broker, self.transactional_id)
        self._owner: OwnedPartition | None = None
        self._fetched_to = 0
        self.steps = 0  # steps that did something (had work)

    # --- the log ------------------------------------------------------------------------------

    def append(self, *events: Event) -> list[Record]:
        """Put ``events`` on the partition's log as a client would (Avro, keyed by entity id)."""
        return [self.append_raw(avro.encode_event(e), key=entity_id(e).encode()) for e in events]

    def append_raw(
        self,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> Record:
        """Put any bytes on the partition's log (hostile records included)."""
        return self.broker.append(
            self.topics.events, value, key=key, partition=self.partition, headers=headers
        )

    def log(self) -> list[Record]:
        return self.broker.records(self.topics.events, self.partition)

    # --- running ------------------------------------------------------------------------------

    @property
    def owner(self) -> OwnedPartition:
        """The partition runner (opened at the first step)."""
        if self._owner is None:
            raise AssertionError("the driver has not stepped yet: await driver.open()")
        return self._owner

    async def open(self) -> OwnedPartition:
        """Take the partition as a node does on assignment (fencing any older owner)."""
        if self._owner is not None:
            return self._owner
        await self.outbox.start()
        index = PartitionIndex(self.data_dir / f"p{self.partition:04d}", self.partition)
        self._owner = OwnedPartition(
            index=index,
            topics=self.topics,
            outbox=self.outbox,
            clock=self.clock,
            group_id=self.group_id,
            node_id=self.node_id,
            budgets=self.budgets,
            committed=self.committed_offset,
            end_offset=self.broker.end_offset(self.topics.events, self.partition),
            ensure_queues=self.ensure_queues,
            scan_limit=self.scan_limit,
            budget=self.budget,
            dispatch_key=self.dispatch_key,
            changelog=ChangelogWriter(
                self.topics.state, self.partition, interval_ms=self.changelog_interval_ms
            ),
            keyring=self.keyring,
            presence=self.presence,
        )
        self._fetched_to = self._owner.resume_offset
        return self._owner

    async def step(self) -> int:
        """Fetch new records and step once at the clock's time, if a node would; returns how
        many decision records (events and dispatch records) were sent."""
        owner = await self.open()
        records = self.broker.records(self.topics.events, self.partition, self._fetched_to)
        records = records[: self.max_records]
        if records:
            self._fetched_to = records[-1].offset + 1
        if not self._unread():
            # Fetched everything: the consumer's position is past the last transaction marker.
            self._fetched_to = self.broker.end_offset(self.topics.events, self.partition)
        now = self.clock.now_ms()
        if not owner.has_work(records, now):
            return 0
        self.steps += 1
        return await owner.step(records, now, self._fetched_to)

    async def settle(self, max_steps: int = 100) -> int:
        """Step until nothing is left to fold or due; returns how many decision records went."""
        owner = await self.open()
        sent = 0
        for _ in range(max_steps):
            if not self._unread() and not owner.has_work([], self.clock.now_ms()):
                return sent
            sent += await self.step()
        raise AssertionError(f"the partition still had work after {max_steps} steps")

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def fence(self) -> None:
        """A newer owner takes the partition's transactional id: this driver's outbox is fenced."""
        self.broker.claim(self.transactional_id)

    def crash_after_commit(self) -> None:
        """The next transaction commits, then the step dies before the index is written."""
        self.outbox.crash_after_commit()

    async def restart(self) -> OwnedPartition:
        """Drop the partition's memory and reopen its index from disk as a new owner."""
        self.close()
        self.outbox = MemoryOutbox(self.broker, self.transactional_id)
        return await self.open()

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()
            self._owner = None

    def _unread(self) -> bool:
        return bool(self.broker.records(self.topics.events, self.partition, self._fetched_to))

    # --- what came out ------------------------------------------------------------------------

    @property
    def committed_offset(self) -> int | None:
        """The group's committed offset for the partition (the next record to read)."""
        return self.broker.committed(self.group_id, self.topics.events, self.partition)

    def sent(self, topic: str | None = None) -> list[Record]:
        """Every record the partition's transactions committed (to ``topic`` only, if given)."""
        landed = (r for t in self.broker.transactions for r in t.records)
        return [r for r in landed if topic is None or r.topic == topic]

    @overload
    def decisions(self) -> list[Event]: ...

    @overload
    def decisions(self, kind: type[E], /, *more: type[E]) -> list[E]: ...

    def decisions(self, *kinds: type[Any]) -> list[Any]:
        """The events the node wrote (leases, expiries, fires), decoded; only ``kinds`` if given."""
        events = [avro.decode_event(_value(r)) for r in self.sent(self.topics.events)]
        return [e for e in events if not kinds or isinstance(e, kinds)]

    def dispatched(self, queue: str | None = None) -> list[Dispatch]:
        """The dispatch records sent, decoded (those of ``queue`` only, if given)."""
        if queue is None:
            sent = (
                r for r in self.sent() if r.topic.startswith(f"{self.topics.namespace}.dispatch.")
            )
        else:
            sent = (r for r in self.sent() if r.topic == self.topics.dispatch(queue))
        return [avro.decode_dispatch(_value(r)) for r in sent]

    def effects(self) -> list[Record]:
        return self.sent(self.topics.effects)

    def changelog(self) -> list[Record]:
        """What the partition's transactions wrote to the state changelog, in order."""
        return self.sent(self.topics.state)

    def job(self, job_id: str) -> JobState | None:
        """The job's state as the index holds it (what was committed, nothing in flight)."""
        return self.owner.index.job(job_id)

    def job_timeline(self, job_id: str) -> list[TimelineEntry]:
        """Every event of the job as the fold judged it (verdict, reason), from the index."""
        return self.owner.index.timeline(job_id, schedule=False)

    def schedule(self, schedule_id: str) -> ScheduleState | None:
        return self.owner.index.schedule(schedule_id)

    def jobs(self, job_ids: Iterable[str]) -> dict[str, JobState | None]:
        return {job_id: self.job(job_id) for job_id in job_ids}


def _value(record: Record) -> bytes:
    assert record.value is not None
    return record.value
