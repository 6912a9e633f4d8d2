"""One transaction per node tick: every owned partition's outputs and offsets, exactly-once v2.

A node has one transactional producer (librdkafka), not one per partition. Each partition's step
hands its records and consumer offset to ``NodeTransactions.send`` (through its
``PartitionSender``, the ``ports.PartitionOutbox``); the sends that arrive while a transaction is
in flight go together in the next one (group commit), so a node with six busy partitions commits
one transaction per tick instead of six.

What fences a zombie (KIP-447, as Kafka Streams' exactly-once v2):
- every transaction carries the offsets of each partition it holds outputs of, sent with the
  consumer's group metadata; the group coordinator refuses them from a member of an older
  generation (a node frozen past its session and thawed), the transaction aborts and nothing of
  it, records or offsets, becomes visible (``Fenced`` to each step);
- a new owner reads the committed offset with ``require_stable`` (read_committed,
  ``rdkafka_group``): it waits for a pending transaction holding that partition's offset to commit
  or abort, so it never decides beside a zombie's transaction in flight; the offsets' metadata
  names their committer (``committer``), whose transaction is fenced at once if its member left
  the group, and waited for if it is live (``pending_offsets``);
- the broker aborts a transaction left open past ``TRANSACTION_TIMEOUT_MS`` (a killed node's);
- the node's transactional id is its node id: a restarted node fences its previous incarnation.

A record the broker refuses (too large, its topic missing or not allowed) holds back its decision
only: the transaction is aborted and tried again without it; an effect refused fails its own
partition's send (``RecordRefused``) and the others go on. librdkafka's transaction calls block:
each transaction runs on a thread of its own, the delivery reports are served by its commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from evsched.adapters.kafka.partition_outbox import KafkaOutbox
from evsched.adapters.kafka.rdkafka_producer import CLIENT_LOGGER, producer_config
from evsched.adapters.kafka.topics import STATE_MAX_MESSAGE_BYTES
from evsched.errors import BrokerUnavailable, Fenced, RecordRefused
from evsched.ports import ConsumerOffset, Holdback, Outgoing

log = structlog.get_logger("evsched.node")

# What one transaction call may take (init, offsets, commit, abort).
CALL_TIMEOUT_S = 30.0
# The broker aborts a transaction left open this long (a killed or frozen node's): a new owner of
# its partitions waits for that before it reads their offsets. Far above a tick's transaction
# (milliseconds); see docs/operations.md "Failover" for the broker's check interval.
TRANSACTION_TIMEOUT_MS = 5_000
# How long a transaction waits for a dispatch topic's metadata before holding its decisions back.
METADATA_WAIT_S = 10.0
# Transactions tried per tick while records are refused: each failed try finds or holds back at
# least one culprit, so a tick never loops.
TRANSACTION_TRIES = 5

# Errors about one record rather than the producer or the broker.
REFUSED = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_RECORD,
        KafkaError.TOPIC_EXCEPTION,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.POLICY_VIOLATION,
    }
)
# The group coordinator's answers to a member of an older generation.
STALE_MEMBER = frozenset(
    {
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
    }
)


@dataclass(slots=True)
class _Send:
    """One partition's part of a tick: its records, offset and where refusals are held back."""

    partition: int
    outgoing: list[Outgoing]
    offset: ConsumerOffset | None
    holdback: Holdback
    done: asyncio.Future[list[Outgoing]]
    records: list[Outgoing] = field(default_factory=list)  # what this try sends


class _Refused(Exception):
    """Records were refused: abort and retry without the culprits.

    ``decisions`` (by send index) are culprits; ``suspects`` shared a refused batch with others
    and go alone next time; ``effects`` (by send index) fail their send.
    """

    def __init__(
        self,
        decisions: Mapping[int, dict[str, str]] | None = None,
        effects: Mapping[int, str] | None = None,
        suspects: set[str] | None = None,
    ) -> None:
        super().__init__("records refused")
        self.decisions = decisions or {}
        self.effects = effects or {}
        self.suspects = suspects or set()


class NodeTransactions:
    """The node's transactional producer; ``for_partition`` gives each partition its outbox."""

    def __init__(
        self,
        settings: Any,
        *,
        transactional_id: str,
        client_id: str,
        group_metadata: Callable[[], Any] | None,
        member_id: Callable[[], str | None] = lambda: None,
        checked_queues: Container[str] = frozenset(),
    ) -> None:
        self.settings = settings
        self.transactional_id = transactional_id
        self.client_id = client_id
        # None: offsets are sent under the group id alone (no generation check; tools, tests).
        self.group_metadata = group_metadata
        self.member_id = member_id  # the group member whose generation the offsets carry
        self._producer: Producer | None = None
        self._starting: asyncio.Lock | None = None
        self._queue: list[_Send] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # Queues whose dispatch topic the node checked already (its QueueTopics): no metadata is
        # asked of them. Another queue's topic (a tool's, a test's) is asked at every tick.
        self.checked_queues = checked_queues
        self._broken = False  # the producer failed in a way only a new one mends
        # Decisions that shared a refused batch: each goes alone, so the culprit shows.
        self.suspects: set[str] = set()
        self._standalone: dict[str, Any] = {}  # group metadata without membership, by group id
        self.transactions = 0  # committed

    async def fence(self, transactional_id: str) -> None:
        """Abort whatever ``transactional_id``'s producer has open, and fence it: a producer of
        that id takes its epoch. Our own id is fenced by ``start`` already."""
        if transactional_id == self.transactional_id:
            return
        log.warning("transaction_fencing", transactional_id=transactional_id)
        config = producer_config(
            self.settings,
            client_id=self.client_id,
            **{"transactional.id": transactional_id, "logger": CLIENT_LOGGER},
        )
        fencer = Producer(config)
        try:
            await asyncio.to_thread(fencer.init_transactions, CALL_TIMEOUT_S)
        except KafkaException as exc:
            log.warning(
                "transaction_fence_failed", transactional_id=transactional_id, error=repr(exc)
            )
        finally:
            await asyncio.to_thread(_dispose, fencer)

    def for_partition(self, partition: int) -> PartitionSender:
        return PartitionSender(self, partition)

    async def start(self) -> None:
        """Take the transactional id (a previous producer of it is fenced); idempotent."""
        if self._starting is None:
            self._starting = asyncio.Lock()
            self._wake = asyncio.Event()
        async with self._starting:
            if self._producer is not None:
                return
            config = producer_config(
                self.settings,
                client_id=self.client_id,
                **{
                    "transactional.id": self.transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    # After a commit the coordinator answers the next transaction's offsets
                    # CONCURRENT_TRANSACTIONS for a few ms: retried at 100 ms by default.
                    "retry.backoff.ms": 5,
                    "retry.backoff.max.ms": 50,
                    "linger.ms": 2,
                    "message.max.bytes": STATE_MAX_MESSAGE_BYTES + (64 << 10),
                    "topic.metadata.propagation.max.ms": int(METADATA_WAIT_S * 1000),
                    "logger": CLIENT_LOGGER,
                },
            )
            fresh = Producer(config)
            try:
                await asyncio.to_thread(fresh.init_transactions, CALL_TIMEOUT_S)
            except KafkaException as exc:
                await asyncio.to_thread(_dispose, fresh)
                raise _mapped(exc) from exc
            self._producer = fresh
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._commits(), name="evsched-node-transactions")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for pending in self._queue:
            if not pending.done.done():
                pending.done.set_exception(BrokerUnavailable("node transactions closed"))
        self._queue.clear()
        producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.to_thread(_dispose, producer)

    async def send(
        self,
        partition: int,
        outgoing: Sequence[Outgoing],
        offset: ConsumerOffset | None,
        holdback: Holdback,
    ) -> list[Outgoing]:
        """Send with the next transaction; returns what was sent (held back decisions left out)."""
        if self._producer is None or self._wake is None:
            raise BrokerUnavailable(f"transactions {self.transactional_id} are not started")
        done: asyncio.Future[list[Outgoing]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Send(partition, list(outgoing), offset, holdback, done))
        self._wake.set()
        return await done

    # --- the committer ------------------------------------------------------------------------

    async def _commits(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            sends, self._queue = self._queue, []
            if not sends:
                continue
            try:
                await self._tick(sends)
            except Exception as exc:  # each send learns why; the next tick starts afresh
                log.warning(
                    "transaction_failed",
                    fenced=isinstance(exc, Fenced),
                    partitions=sorted({s.partition for s in sends}),
                    error=repr(exc),
                )
                for s in sends:
                    if not s.done.done():
                        s.done.set_exception(_own_copy(exc))
                del exc  # its traceback holds this coroutine's frame
                if self._broken:
                    await self._discard()

    async def _discard(self) -> None:
        """After a fatal error (fenced by a newer producer of this id, or one that cannot abort):
        the producer goes, and the partitions' reopens start a new one (``start``), whose epoch
        ends whatever the old one left open."""
        self._broken = False
        producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.to_thread(_dispose, producer)

    async def _tick(self, sends: list[_Send]) -> None:
        await self._hold_without_metadata(sends)
        for s in sends:
            s.records = [
                o for o in s.outgoing if o.decision is None or not s.holdback.holds(o.decision)
            ]
        live = list(sends)
        for attempt in range(1, TRANSACTION_TRIES + 1):
            if not live:
                return
            try:
                await asyncio.to_thread(self._transact, live)
            except _Refused as exc:
                live = self._without_culprits(live, exc)
                if attempt == TRANSACTION_TRIES:
                    raise RecordRefused(f"records refused in {attempt} transactions") from exc
                continue
            except KafkaException as exc:  # begin_transaction's, outside _aborted
                if _fatal(exc):
                    self._broken = True  # a fatal producer fails every later call: replace it
                raise _mapped(exc) from exc
            self.transactions += 1
            for s in live:
                s.done.set_result(s.records)
            return

    def _without_culprits(self, live: list[_Send], refused: _Refused) -> list[_Send]:
        """The sends to try again: culprit decisions held back, refused effects' sends failed."""
        self.suspects |= refused.suspects
        for i, reason in refused.effects.items():
            live[i].done.set_exception(RecordRefused(reason))
        for i, reasons in refused.decisions.items():
            s = live[i]
            for decision, why in reasons.items():
                self.suspects.discard(decision)
                s.holdback.add(decision, "send", why)
            s.records = [o for o in s.records if o.decision not in reasons]
        return [s for s in live if not s.done.done()]

    async def _hold_without_metadata(self, sends: Sequence[_Send]) -> None:
        """Hold back decisions whose dispatch topic has no metadata in time (before the
        transaction: librdkafka would wait for it holding every partition's tick)."""
        unknown = {
            o.topic
            for s in sends
            for o in s.outgoing
            if o.queue is not None and o.queue not in self.checked_queues
        }
        if not unknown:
            return
        producer = self._producer
        assert producer is not None
        unusable: dict[str, str] = {}
        for topic in unknown:
            try:
                md = await asyncio.to_thread(producer.list_topics, topic, METADATA_WAIT_S)
                found = md.topics.get(topic)
                if found is None or found.error is not None or not found.partitions:
                    why = "unknown topic" if found is None else str(found.error)
                    unusable[topic] = f"no metadata for {topic}: {why}"
            except KafkaException as exc:
                unusable[topic] = f"no metadata for {topic} after {METADATA_WAIT_S} s: {exc!r}"
        for s in sends:
            for o in s.outgoing:
                held = o.decision is None or s.holdback.holds(o.decision)
                if o.topic in unusable and not held and o.decision is not None:
                    s.holdback.add(o.decision, "topic", unusable[o.topic])

    def _transact(self, sends: Sequence[_Send]) -> None:
        """On a worker thread: one transaction of every send's records and offsets."""
        producer = self._producer
        if producer is None:
            raise KafkaException(KafkaError(KafkaError._STATE, "producer closed"))
        reports: list[tuple[int, Outgoing, KafkaError]] = []

        def delivered(index: int, o: Outgoing, err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                reports.append((index, o, err))

        producer.begin_transaction()
        try:
            self._produce_all(producer, sends, delivered, reports)
            # The metadata names this producer and its member: a new owner finding these offsets
            # held by an open transaction fences it unless the member is live (pending_offsets).
            metadata = committer(self.transactional_id, self.member_id())
            offsets = [
                TopicPartition(
                    s.offset.topic,
                    s.offset.partition,
                    s.offset.next_offset,
                    metadata=metadata,
                )
                for s in sends
                if s.offset is not None
            ]
            if offsets:
                producer.send_offsets_to_transaction(offsets, self._metadata(sends), CALL_TIMEOUT_S)
            producer.commit_transaction(CALL_TIMEOUT_S)
        except (KafkaException, _Refused) as exc:
            raise self._aborted(producer, exc, sends, reports) from exc

    def _produce_all(
        self,
        producer: Producer,
        sends: Sequence[_Send],
        delivered: Callable[..., None],
        reports: Sequence[object],
    ) -> None:
        """Suspects first, each in a batch of its own (the first refused is the culprit)."""
        for i, s in enumerate(sends):
            for o in s.records:
                if o.decision in self.suspects:
                    self._produce(producer, o, functools.partial(delivered, i, o))
                    producer.flush(CALL_TIMEOUT_S)
                    if reports:
                        raise _Refused()
        for i, s in enumerate(sends):
            for o in s.records:
                if o.decision not in self.suspects:
                    self._produce(producer, o, functools.partial(delivered, i, o))

    def _aborted(
        self,
        producer: Producer,
        exc: KafkaException | _Refused,
        sends: Sequence[_Send],
        reports: Sequence[tuple[int, Outgoing, KafkaError]],
    ) -> Exception:
        """End a failed transaction; what to raise: the refusals it met, Fenced, or its error."""
        producer.poll(0)  # serve what it reported
        try:
            producer.abort_transaction(CALL_TIMEOUT_S)
        except KafkaException:
            self._broken = True
        if _fatal(exc):
            self._broken = True
        refused = _refusals(sends, reports, self.suspects)
        if refused is not None:
            return refused
        if isinstance(exc, _Refused):
            return exc
        return _fenced_or(exc)

    def _produce(self, producer: Producer, o: Outgoing, on_delivery: Any) -> None:
        options: dict[str, Any] = {"on_delivery": on_delivery}
        if o.partition is not None:
            options["partition"] = o.partition
        if o.headers:
            options["headers"] = list(o.headers)
        while True:
            try:
                producer.produce(o.topic, o.value, o.key, **options)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
            except KafkaException as exc:  # refused before it was even queued
                on_delivery(exc.args[0], None)
                raise _Refused() from exc

    def _metadata(self, sends: Sequence[_Send]) -> Any:
        if self.group_metadata is not None:
            return self.group_metadata()
        groups = {s.offset.group_id for s in sends if s.offset is not None}
        if len(groups) != 1:
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, f"offsets of {groups}"))
        group = groups.pop()
        if group not in self._standalone:
            # Generation -1, no member: the coordinator takes the offsets without a check.
            member = Consumer({"bootstrap.servers": self.settings.bootstrap, "group.id": group})
            self._standalone[group] = member.consumer_group_metadata()
            member.close()
        return self._standalone[group]


class PartitionSender:
    """One partition's ``ports.PartitionOutbox``: its sends join the node's next transaction."""

    def __init__(self, transactions: NodeTransactions, partition: int) -> None:
        self.transactions = transactions
        self.partition = partition

    async def start(self) -> None:
        await self.transactions.start()

    async def send(
        self, outgoing: Sequence[Outgoing], *, offset: ConsumerOffset | None, holdback: Holdback
    ) -> list[Outgoing]:
        return await self.transactions.send(self.partition, outgoing, offset, holdback)

    async def close(self) -> None:
        """The node's producer stays for its other partitions (``NodeTransactions.close``)."""


def committer(transactional_id: str, member_id: str | None) -> str:
    """Offsets' metadata: who commits them (no member id outside a group: a tool's, a test's)."""
    return json.dumps({"transactional_id": transactional_id, "member_id": member_id})


def committer_of(metadata: str) -> tuple[str, str | None]:
    """(transactional id, member id or None) of offsets' metadata, as ``committer`` wrote it;
    metadata of another form is a transactional id alone (written before member ids were)."""
    with contextlib.suppress(ValueError):
        found = json.loads(metadata)
        if isinstance(found, dict) and isinstance(found.get("transactional_id"), str):
            member_id = found.get("member_id")
            return found["transactional_id"], member_id if isinstance(member_id, str) else None
    return metadata, None


def _refusals(
    sends: Sequence[_Send], reports: Sequence[tuple[int, Outgoing, KafkaError]], suspects: set[str]
) -> _Refused | None:
    """Who the refused records belong to (None: no record was refused).

    A refused batch fails each of its records: one decision alone (or a suspect, sent alone) is
    the culprit; several become suspects; an effect fails its send only when no decision shared
    the refusal (it may have been collateral otherwise).
    """
    decisions: dict[int, dict[str, str]] = {}
    effects: dict[int, str] = {}
    for index, o, err in reports:
        if err.code() not in REFUSED:
            continue
        if o.decision is None:
            effects.setdefault(index, f"effect to {o.topic} refused: {err.str()}")
        else:
            decisions.setdefault(index, {})[o.decision] = f"{o.topic}: {err.str()}"
    named = {d for reasons in decisions.values() for d in reasons}
    if not named and not effects:
        return None
    if not named:
        return _Refused(effects=effects)
    culprits = named & suspects
    if culprits or len(named) == 1:
        exact = culprits or named
        return _Refused(
            decisions={
                i: {d: why for d, why in reasons.items() if d in exact}
                for i, reasons in decisions.items()
            }
        )
    return _Refused(suspects=named)


def _own_copy(exc: Exception) -> Exception:
    """A send's own exception for a failed tick, without the committer's frames.

    A step that fails clears the frames of what it raised (``runtime.node.steps``: index
    handles); one exception shared by every send carried the committer's frame, and clearing
    the frame of a suspended coroutine closes it: the committer died ("cannot reuse already
    awaited coroutine") and every later send waited forever.
    """
    try:
        copy = type(exc)(*exc.args)
    except Exception:
        copy = BrokerUnavailable(repr(exc))
    return copy


def _fatal(exc: BaseException) -> bool:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and (err.fatal() or err.code() == KafkaError._FENCED)


def _fenced_or(exc: KafkaException) -> KafkaException | Fenced:
    err = exc.args[0] if exc.args else None
    if isinstance(err, KafkaError) and (
        err.code() in STALE_MEMBER or err.code() == KafkaError._FENCED or err.fatal()
    ):
        return Fenced(f"transaction fenced: {err.str()}")
    return exc


def _mapped(exc: KafkaException) -> Exception:
    fenced = _fenced_or(exc)
    if isinstance(fenced, Fenced):
        return fenced
    return BrokerUnavailable(repr(exc))


def _dispose(producer: Producer) -> None:
    """Closes a producer without waiting for what it still holds (an open transaction aborts)."""
    with contextlib.suppress(Exception):
        producer.purge()
        producer.flush(0)
    with contextlib.suppress(Exception):
        producer.close()


# A partition's outbox: a producer of its own (aiokafka), or a share of the node's transactions.
NodeOutbox = KafkaOutbox | PartitionSender
