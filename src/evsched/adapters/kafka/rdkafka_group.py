"""The node's member of the events topic's consumer group on librdkafka (confluent-kafka).

The surface of ``partition_log.KafkaGroupConsumer`` (plain partition numbers,
``ports.Record``s, evsched's errors), plus ``group_metadata()``: what a transaction's offsets are
sent with, so the group coordinator refuses them from a member of an older generation and the
whole transaction aborts (exactly-once v2, KIP-447; ``node_transactions``).

Every call of the member runs on one thread of its own (``rdkafka_thread``): confluent-kafka
lets one caller at a time into a consumer. librdkafka serves the group's rebalance callbacks
inside ``poll`` (or ``close``), on that thread: each is handed to the event loop and the thread
waits for it, so the group rejoins only once the node has closed what it lost (eager protocol,
``roundrobin`` like aiokafka's default: both clients can share a group while a cluster is
upgraded). Pauses, resumes and seeks are queued for the thread, never waited for; positions, the
member id and the group metadata are read on the thread after each fetch and kept, so a step and
a transaction never wait for a fetch. Committed offsets and watermarks are asked by a second
consumer of the group that never joins it. Offsets are never committed here; read_committed
offset fetches require stable offsets, so a new owner waits for a pending transaction to end
before it reads the committed offset, or fences a dead member's (``pending_offsets``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from evsched.adapters.clock import monotonic_s
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.client_logs import group_joined
from evsched.adapters.kafka.partition_log import GroupMembership, KafkaGroupConsumer, Rebalance
from evsched.adapters.kafka.pending_offsets import GroupMembers, PendingOffsets
from evsched.adapters.kafka.rdkafka_options import rdkafka_config
from evsched.adapters.kafka.rdkafka_thread import POLL_SLICE_S, ConsumerThread
from evsched.errors import BrokerUnavailable, PartitionRevoked
from evsched.ports import Record
from evsched.settings import Settings

CLIENT_LOGGER = logging.getLogger("evsched.rdkafka")

# How long a blocking metadata or offsets call may take.
CALL_TIMEOUT_S = 10.0
# The longest a node may take between two fetches (a step, a revoke's closes) before the group
# counts it gone; librdkafka also uses it as the rebalance timeout.
MAX_POLL_INTERVAL_MS = 30_000
# Errors a fetch reports that leave the consumer working: it retries them itself.
_PASSING = frozenset(
    {
        KafkaError._PARTITION_EOF,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._MAX_POLL_EXCEEDED,
    }
)


def consumer_config(settings: Settings, *, group_id: str, client_id: str) -> dict[str, Any]:
    """A read_committed group member without auto-commit, timed as aiokafka's (clients)."""
    timeouts = kafka.group_timeouts(settings)
    return {
        "bootstrap.servers": settings.bootstrap,
        "group.id": group_id,
        "client.id": client_id,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "roundrobin",
        "session.timeout.ms": timeouts["session_timeout_ms"],
        "heartbeat.interval.ms": timeouts["heartbeat_interval_ms"],
        "max.poll.interval.ms": max(MAX_POLL_INTERVAL_MS, timeouts["rebalance_timeout_ms"]),
        # As aiokafka's consumer (clients.consumer): batches under load, 10 ms at most.
        "fetch.wait.max.ms": 10,
        "fetch.min.bytes": 64 << 10,
        **rdkafka_config(settings.kafka_options),
        "logger": CLIENT_LOGGER,
    }


@contextlib.contextmanager
def _errors(what: str) -> Iterator[None]:
    try:
        yield
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() in (
            KafkaError._STATE,
            KafkaError._UNKNOWN_PARTITION,
        ):
            raise PartitionRevoked(f"{what}: {err.str()}") from exc
        raise BrokerUnavailable(f"{what}: {exc!r}") from exc
    except RuntimeError as exc:  # "Consumer closed"
        raise BrokerUnavailable(f"{what}: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class _Fetched:
    """What one fetch found, and the member's state read right after it, on its thread."""

    messages: list[Message]
    positions: dict[int, int]  # the next offset each assigned partition's fetch reads
    seeks: dict[int, int]  # how many seeks of each partition were made before it ended


class RdkafkaGroupConsumer:
    """The node's group member on librdkafka; ``listener`` is told of every rebalance."""

    def __init__(self, member: GroupMembership, *, listener: Rebalance) -> None:
        self.topic = member.topic
        self.max_records = member.max_records
        self._listener = listener
        self._loop: asyncio.AbstractEventLoop | None = None
        self._config = consumer_config(
            member.settings, group_id=member.group_id, client_id=member.client_id
        )
        self._consumer = Consumer(self._config)
        self._thread = ConsumerThread(f"evsched-{member.client_id}-group")
        # Asks committed offsets and watermarks (read_committed: stable offsets, the last stable
        # offset) without waiting for the member's fetches; never joins the group.
        self._offsets: Consumer | None = None
        # Reads the last committer of an offset a transaction holds (never joins the group).
        self._unstable: Consumer | None = None
        # Fences a transactional id (the node's NodeTransactions.fence); None: wait instead.
        self.fence: Callable[[str], Awaitable[None]] | None = None
        # Who is live in the group: a live committer's transaction is waited for, not fenced.
        self._members = GroupMembers(
            member.settings, member.group_id, client_id=f"{member.client_id}-members"
        )
        self._assigned: set[int] = set()
        self._closed = False
        # Kept by the thread for the event loop and the transactions (see the module's doc).
        self._positions: dict[int, int] = {}
        self._member_id: str | None = None
        self._metadata: Any = None
        # Seeks asked (event loop) and made (thread) per partition: a fetch made before the last
        # seek of a partition was made is dropped for it, as librdkafka drops its own.
        self._seeks_asked: dict[int, int] = {}
        self._seeks_made: dict[int, int] = {}

    async def start(self) -> None:
        """Subscribe, once the cluster answered (BrokerUnavailable if it does not in time)."""
        self._loop = asyncio.get_running_loop()

        def subscribe() -> None:
            self._consumer.list_topics(self.topic, CALL_TIMEOUT_S)
            self._consumer.subscribe(
                [self.topic],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_revoke,
            )

        try:
            with _errors(f"join the group of {self.topic}"):
                await self._thread.call(subscribe)
        except BaseException:
            await self.close()  # its thread too: a retry makes a new member
            raise

    async def close(self) -> None:
        """Leave the group (the revoke callback closes what this node owned) and stop."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(KafkaException, RuntimeError):
            await self._thread.call(self._consumer.close)
        self._thread.stop()
        self._member_id = None
        for other in (self._offsets, self._unstable):
            if other is not None:
                with contextlib.suppress(KafkaException, RuntimeError):
                    await asyncio.to_thread(other.close)

    def group_metadata(self) -> Any:
        """This member's group, generation and member id, as a transaction's offsets carry them
        (as of the last fetch or assignment: a generation passed fails the transaction)."""
        if self._metadata is None:
            raise BrokerUnavailable(f"group metadata of {self.topic}: not a member yet")
        return self._metadata

    def assignment(self) -> set[int]:
        return set(self._assigned)

    def member_id(self) -> str | None:
        """This member's id in the group (None until it joined, or once it left)."""
        return self._member_id

    def _tp(self, partition: int, offset: int | None = None) -> TopicPartition:
        if offset is None:
            return TopicPartition(self.topic, partition)
        return TopicPartition(self.topic, partition, offset)

    def seek(self, partition: int, offset: int) -> None:
        self._owned(partition, "seek")
        self._seeks_asked[partition] = self._seeks_asked.get(partition, 0) + 1
        self._positions[partition] = offset  # until a fetch after the seek says more

        def made() -> None:
            self._seeks_made[partition] = self._seeks_made.get(partition, 0) + 1
            self._consumer.seek(self._tp(partition, offset))

        self._thread.later(made)

    def pause(self, partition: int) -> None:
        self._owned(partition, "pause")
        self._thread.later(lambda: self._consumer.pause([self._tp(partition)]))

    def resume(self, partition: int) -> None:
        self._owned(partition, "resume")
        self._thread.later(lambda: self._consumer.resume([self._tp(partition)]))

    async def position(self, partition: int) -> int:
        """The next offset a fetch of ``partition`` reads (past transaction markers).

        As of the last fetch handed to the node (lower or equal: a fold is found caught up late,
        never early); after a seek, the offset sought until a fetch after it. Never waits.
        """
        self._owned(partition, "position")
        return self._positions.get(partition, -1)

    async def committed(self, partition: int) -> int | None:
        """The group's committed offset (None: nothing committed); waits for stable offsets.

        A transaction still open holds them; with ``fence``, its producer is fenced unless its
        member is live in the group (``pending_offsets``), which the read waits for instead.
        """
        if self.fence is None:
            return await self._stable(partition, CALL_TIMEOUT_S)
        pending = PendingOffsets(
            stable=self._stable,
            last_committer=self._last_committer,
            members=self._members.ids,
            fence=self.fence,
        )
        return await pending.committed(partition)

    def _reader(self) -> Consumer:
        if self._offsets is None:
            self._offsets = Consumer(self._config)
        return self._offsets

    async def _stable(self, partition: int, timeout_s: float) -> int | None:
        reader, tp = self._reader(), self._tp(partition)
        with _errors(f"committed offset of p{partition}"):
            found = await asyncio.to_thread(reader.committed, [tp], timeout_s)
        if found[0].error is not None:
            raise BrokerUnavailable(f"committed offset of p{partition}: {found[0].error}")
        offset = found[0].offset
        return None if offset == OFFSET_INVALID or offset < 0 else int(offset)

    async def _last_committer(self, partition: int) -> str | None:
        """The metadata of the partition's last stable offset commit (read_uncommitted)."""
        if self._unstable is None:
            self._unstable = Consumer({**self._config, "isolation.level": "read_uncommitted"})
        with contextlib.suppress(KafkaException, RuntimeError):
            found = await asyncio.to_thread(
                self._unstable.committed, [self._tp(partition)], CALL_TIMEOUT_S
            )
            return found[0].metadata or None
        return None

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return await self._watermarks(partitions, low=True)

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        """Each partition's last stable offset (read_committed): where a fold is caught up."""
        return await self._watermarks(partitions, low=False)

    async def _watermarks(self, partitions: Collection[int], *, low: bool) -> dict[int, int]:
        reader = self._reader()

        def read() -> dict[int, int]:
            found: dict[int, int] = {}
            for p in partitions:
                lo, hi = reader.get_watermark_offsets(
                    self._tp(p), timeout=CALL_TIMEOUT_S, cached=False
                )
                found[p] = lo if low else hi
            return found

        with _errors(f"offsets of {self.topic}"):
            return await asyncio.to_thread(read)

    async def read_all(self, timeout_s: float, max_records: int) -> dict[int, list[Record]]:
        """Records of every assigned, unpaused partition (rebalances are served meanwhile)."""
        with _errors(f"fetch from {self.topic}"):
            fetched = await self._thread.call(lambda: self._fetch(timeout_s, max_records))
        # From here to the records' feed nothing awaits: a step never sees a position ahead of
        # the records in its inbox.
        stale = {p for p, asked in self._seeks_asked.items() if fetched.seeks.get(p, 0) != asked}
        for p, offset in fetched.positions.items():
            if p not in stale and p in self._assigned:
                self._positions[p] = offset
        batches: dict[int, list[Record]] = {}
        for msg in fetched.messages:
            err = msg.error()
            if err is not None:
                if err.code() in _PASSING:
                    continue
                raise BrokerUnavailable(f"fetch from {self.topic}: {err.str()}")
            partition = msg.partition()
            if partition in self._assigned and partition not in stale:
                batches.setdefault(partition, []).append(_record(msg))
        return batches

    def _fetch(self, timeout_s: float, max_records: int) -> _Fetched:
        """On the thread: what is fetched once the first record comes (within ``timeout_s``),
        polling in short slices so queued pauses and seeks are made in between. librdkafka's
        batch consume would wait out its whole timeout to fill the batch, at every record."""
        deadline = monotonic_s() + timeout_s
        while True:
            self._thread.run_later()
            left = deadline - monotonic_s()
            first = self._consumer.poll(max(0.0, min(POLL_SLICE_S, left)))
            if first is not None or left <= POLL_SLICE_S:
                break
        messages = [] if first is None else [first]
        if first is not None and max_records > 1:
            messages += self._consumer.consume(max_records - 1, 0)
        self._read_member()
        # Seeks made so far, a rebalance callback's included, were made before these records
        # were fetched; one asked and not made yet will rewind past them (the loop drops them).
        return _Fetched(messages, self._fetch_positions(), dict(self._seeks_made))

    def _fetch_positions(self) -> dict[int, int]:
        if not self._assigned:
            return {}
        found = self._consumer.position([self._tp(p) for p in sorted(self._assigned)])
        return {tp.partition: int(tp.offset) for tp in found if tp.offset >= 0}

    def _read_member(self) -> None:
        """On the thread: the member id and group metadata, as of now."""
        with contextlib.suppress(KafkaException, RuntimeError):
            self._member_id = self._consumer.memberid() or None
            self._metadata = self._consumer.consumer_group_metadata()

    def _owned(self, partition: int, what: str) -> None:
        if partition not in self._assigned:
            raise PartitionRevoked(f"{what} p{partition}: not assigned")

    # --- the group's callbacks, on the member's thread inside poll() or close() -----------

    def _on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        partitions = [tp.partition for tp in tps if tp.topic == self.topic]
        # Assigned here, not after the callback, so the listener can pause and seek them.
        consumer.assign(tps)
        self._assigned = set(partitions)
        self._read_member()  # the new generation's, before any transaction of theirs
        group_joined()
        self._handed(self._listener.assigned(partitions))

    def _on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        partitions = [tp.partition for tp in tps if tp.topic == self.topic]
        try:
            self._handed(self._listener.revoked(partitions))
        finally:
            self._assigned = self._assigned - set(partitions)  # the loop reads it meanwhile
            for partition in partitions:
                self._positions.pop(partition, None)
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.unassign()

    def _handed(self, call: Any) -> None:
        """Run the listener's coroutine on the event loop; this thread waits for it to end, then
        makes the pauses, resumes and seeks it asked for (librdkafka would wait for the callback
        to end to make them while it runs: a deadlock)."""
        loop = self._loop
        assert loop is not None, "rebalance before start"
        try:
            asyncio.run_coroutine_threadsafe(call, loop).result()
        finally:
            self._thread.run_later()


def _record(msg: Message) -> Record:
    _, log_at = msg.timestamp()
    return Record(
        topic=msg.topic() or "",
        partition=msg.partition() or 0,
        offset=msg.offset() or 0,
        log_at=log_at,
        key=msg.key(),
        value=msg.value(),
        headers=_headers(msg),
    )


def _headers(msg: Message) -> tuple[tuple[str, bytes], ...]:
    raw = msg.headers()
    if not isinstance(raw, list):
        return ()
    return tuple((name, value if isinstance(value, bytes) else b"") for name, value in raw)


# The node's group member: aiokafka's (a producer per partition) or librdkafka's (one transaction
# per node tick, EVSCHED_NODE_TRANSACTIONS=tick).
GroupMember = KafkaGroupConsumer | RdkafkaGroupConsumer
