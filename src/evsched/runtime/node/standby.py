"""Standby copies (``evsched node --standby``): warm indexes of the partitions a node does not own.

Each standby partition's index lives where the node opens it as owner (``<data-dir>/p0000``...)
and is kept by folding the events log, as a read replica does: the index is a pure function of
the log, so it is the owner's, byte for byte, at the same offset. It folds only the records
below the owner group's committed offset: those were folded by the owner and their effects sent
in the transaction that committed the offset; a record past it may still owe an effect, which
the next owner must fold (and send) itself. When the group gives the node one of these
partitions, the node releases the standby copy (reader stopped, index closed) before it opens
the index as owner, finds it near the log's end (plan USE_LOCAL) and folds a short tail. A copy
folds no further than its partition's changelog snapshot either (the newest meta's applied
offset): an owner writes its changelog on from the index it opens, so that index must not hold
changes the changelog lacks (``runtime.projection.changelog``). A copy
that is missing, far behind, of another fold version or behind a trimmed log's start is first
made usable as a replica's is (``runtime.projection.replica_restore``: restored from the changelog,
reset, or refused), in the background. A standby reads, and never writes to any topic.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any, Protocol

import structlog

from evsched.adapters.clock import monotonic_s
from evsched.adapters.kafka.group_offsets import GroupOffsets
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.adapters.proofs import NodeKeyring
from evsched.errors import BrokerUnavailable, IndexVersionMismatch
from evsched.ports import PartitionLog, Record
from evsched.runtime.node.index_restore import OpenLog, kafka_reader
from evsched.runtime.projection.changelog import META_FORMAT, latest_meta
from evsched.runtime.projection.changelog_restore import LocalIndex, local_index
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.replica_restore import prepare_partitions, worth_a_look
from evsched.runtime.projection.restore import open_index
from evsched.settings import Settings

# How long one read waits for records, and how often the group's offsets and the log's ends
# are asked for (each is one round trip for every standby partition).
READ_WAIT_S = 0.2
REFRESH_S = 0.5
FETCH_RECORDS = 5_000
# A partition whose fold failed waits this long before it folds again from its index.
RETRY_S = 5.0


class CommittedOffsets(Protocol):
    """The owner group's committed offset per partition (``adapters.kafka.group_offsets``)."""

    async def committed(self) -> dict[int, int]: ...

    async def close(self) -> None: ...


class Standby:
    """The node's standby partitions: ``hold`` opens and follows them, ``release`` gives them up.

    Both run under the node's lock, between the group's callbacks. ``release`` waits for a copy
    being prepared to be cancelled, then closes the indexes without awaiting, so no fold of a
    released partition can run after it returned.
    """

    def __init__(
        self,
        log: PartitionLog,
        offsets: CommittedOffsets,
        data_dir: Path,
        *,
        lag_gauge: Any = None,
        logger: Any = None,
        open_state: OpenLog | None = None,
        only: Collection[int] | None = None,
        keyring: NodeKeyring | None = None,
    ) -> None:
        self.only = None if only is None else frozenset(only)  # --standby-partitions
        self.keyring = keyring  # the node's keys: a copy judges proofs as its owner does
        self.reader = log  # read_committed, every events partition assigned
        self.offsets = offsets
        self.data_dir = data_dir
        self.lag_gauge = lag_gauge  # evsched_node_standby_lag_records, or None
        self.log = logger if logger is not None else structlog.get_logger("evsched.standby")
        self.projectors: dict[int, Projector] = {}
        self.bounds: dict[int, int] = {}  # fold below this offset only (the group's offset)
        self.lag: dict[int, int] = {}
        self.taken: dict[int, int] = {}  # released for the owner: the index's next offset
        self.open_state = open_state  # readers of <ns>.state partitions (None: none to restore)
        self._state: PartitionLog | None = None  # reads the held partitions' changelog metas
        self._state_of: list[int] = []
        self.preparing: dict[int, asyncio.Task[None]] = {}
        self._retry_at: dict[int, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    async def start(self) -> None:
        await self.reader.start()
        self._task = asyncio.create_task(self._run(), name="evsched-standby")

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.release([*self.projectors, *self.preparing])
        self.taken.clear()
        await self._close_state()
        await self.reader.close()
        await self.offsets.close()

    async def hold(self, partitions: Iterable[int]) -> None:
        """Open each partition's index as a standby copy and follow the log from it.

        One that is missing, far behind, of another fold version or behind the log's start is
        prepared first, in the background (without a changelog reader: left alone, and the
        node's open restores or rebuilds it if the partition ever comes here).
        """
        wanted = [
            p
            for p in partitions
            if p not in self.projectors
            and p not in self.preparing
            and (self.only is None or p in self.only)
        ]
        if self._stopped or not wanted:
            return
        try:
            starts = await self.reader.start_offsets(wanted)
            ends = await self.reader.end_offsets(wanted)
        except BrokerUnavailable as exc:  # a rebalance must not fail for its standby copies
            self.log.warning("standby_hold_failed", partitions=wanted, error=str(exc))
            return
        for partition in wanted:
            self._hold_or_prepare(partition, starts[partition], ends[partition])

    def _hold_or_prepare(self, partition: int, log_start: int, log_end: int) -> None:
        try:
            local = local_index(self.data_dir, partition)
        except Exception as exc:  # e.g. still locked: never fold what another handle writes
            self._skipped(partition, repr(exc))
            return
        if self.open_state is not None and worth_a_look(local, log_start, log_end):
            self.preparing[partition] = asyncio.create_task(
                self._prepare(partition, local, log_start),
                name=f"evsched-standby-prepare-{partition}",
            )
        else:
            self._hold_one(partition, log_start)

    async def _prepare(self, partition: int, local: LocalIndex, log_start: int) -> None:
        """Restore (or reset) the copy as a replica's is, then hold it; refused: left alone."""
        assert self.open_state is not None
        try:
            state = self.open_state([partition])
            await state.start()
            try:
                done = await prepare_partitions(
                    state, self.data_dir, {partition: local}, {partition: log_start}
                )
            finally:
                await state.close()
        except Exception as exc:
            self._skipped(partition, f"could not be prepared: {exc!r}")
            return
        finally:
            self.preparing.pop(partition, None)
        if partition in done.refused:
            self._skipped(partition, done.refused[partition])
            return
        self._hold_one(partition, log_start)

    def _hold_one(self, partition: int, log_start: int) -> None:
        try:
            index = open_index(self.data_dir, partition)
        except IndexVersionMismatch as exc:
            self._skipped(partition, f"fold version {exc.found}, not {exc.expected}")
            return
        except Exception as exc:  # e.g. still locked: never fold what another handle writes
            self._skipped(partition, repr(exc))
            return
        if index.applied_offset() + 1 < log_start:
            index.close()
            self._skipped(partition, f"the log starts at {log_start}, past the index")
            return
        projector = Projector(index, keyring=self.keyring)
        self.projectors[partition] = projector
        self.reader.seek(partition, projector.next_offset)
        self.taken.pop(partition, None)
        self.log.info(
            "standby_partition_held", partition=partition, applied_offset=index.applied_offset()
        )

    def _skipped(self, partition: int, reason: str) -> None:
        self.log.warning("standby_partition_skipped", partition=partition, reason=reason)

    async def release(self, partitions: Iterable[int]) -> None:
        """Stop following the partitions and close their indexes (their RocksDB locks freed).

        A copy being prepared is cancelled first: its restore never swaps an index in under
        the owner. Nothing of a released partition is folded after this returns.
        """
        partitions = list(partitions)
        for partition in partitions:
            if (task := self.preparing.pop(partition, None)) is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for partition in partitions:
            projector = self.projectors.pop(partition, None)
            if projector is None:
                continue
            self.taken[partition] = projector.next_offset
            projector.index.close()
            self.bounds.pop(partition, None)
            self.lag.pop(partition, None)
            self._retry_at.pop(partition, None)
            if self.lag_gauge is not None:
                with contextlib.suppress(KeyError):
                    self.lag_gauge.remove(str(partition))
            self.log.info("standby_partition_released", partition=partition)

    def took_over(self, partition: int, resume_offset: int, end_offset: int) -> None:
        """The node opened, as owner, a partition its standby copy held: log the tail to fold."""
        held_to = self.taken.pop(partition, None)
        if held_to is None:
            return
        if held_to != resume_offset:  # restored or rebuilt on open: the copy went unused
            self.log.warning(
                "standby_copy_unused", partition=partition, held_to=held_to, resume=resume_offset
            )
            return
        self.log.info(
            "standby_takeover",
            partition=partition,
            resume_offset=resume_offset,
            end_offset=end_offset,
            tail_records=max(0, end_offset - resume_offset),
        )

    # --- following the log --------------------------------------------------------------------

    async def _run(self) -> None:
        refreshed = -REFRESH_S
        while True:
            try:
                if monotonic_s() - refreshed >= REFRESH_S:
                    await self._refresh()
                    refreshed = monotonic_s()
                await self._read_once()
            except BrokerUnavailable as exc:
                self.log.warning("standby_read_failed", error=str(exc), retry_in_s=RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def _refresh(self) -> None:
        """The group's offsets (how far to fold) and the log's ends (how far behind we are)."""
        committed = await self.offsets.committed()
        held = sorted(self.projectors)
        ends = await self.reader.end_offsets(held) if held else {}
        snapshots = await self._snapshots(held)
        for partition in held:
            projector = self.projectors.get(partition)
            if projector is None:
                continue  # released while we asked
            bound = committed.get(partition, 0)
            self.bounds[partition] = min(bound, snapshots.get(partition, bound))
            self.lag[partition] = max(0, ends[partition] - projector.next_offset)
            if self.lag_gauge is not None:
                self.lag_gauge.labels(str(partition)).set(self.lag[partition])

    async def _snapshots(self, held: list[int]) -> dict[int, int]:
        """Per held partition whose changelog an owner would write on from, the offset after
        its snapshot: a copy folded past it would hold changes the changelog lacks."""
        if self.open_state is None or not held:
            return {}
        if self._state is None or self._state_of != held:
            await self._close_state()
            self._state = self.open_state(held)
            self._state_of = held
            await self._state.start()
        found: dict[int, int] = {}
        for partition in held:
            meta = await latest_meta(self._state, partition)
            if meta is not None and meta.complete and meta.format == META_FORMAT:
                found[partition] = meta.applied_offset + 1
        return found

    async def _close_state(self) -> None:
        if self._state is not None:
            state, self._state = self._state, None
            await state.close()

    async def _read_once(self) -> None:
        now = monotonic_s()
        active = [
            p
            for p, projector in self.projectors.items()
            if projector.next_offset < self.bounds.get(p, 0) and self._retry_at.get(p, 0) <= now
        ]
        if not active:
            await asyncio.sleep(READ_WAIT_S)
            return
        batches = await self.reader.read(active, READ_WAIT_S, FETCH_RECORDS)
        for partition, records in batches.items():
            if partition in self.projectors:  # else released while we read: not ours to fold
                self._fold(partition, records)

    def _fold(self, partition: int, records: list[Record]) -> None:
        projector = self.projectors[partition]
        bound = self.bounds.get(partition, 0)
        below = [r for r in records if r.offset < bound]
        try:
            if below:
                projector.commit(projector.fold(below))
        except Exception as exc:
            # The fold refuses what it cannot carry out, so this is a second line of defence:
            # the partition folds again from its index after a wait; the others go on.
            projector.next_offset = projector.index.applied_offset() + 1
            self._retry_at[partition] = monotonic_s() + RETRY_S
            self.log.error(
                "standby_fold_failed", partition=partition, error=repr(exc), retry_in_s=RETRY_S
            )
            below = []
        if len(below) < len(records):
            # Records past the group's offset are read again once the owner committed them.
            self.reader.seek(partition, projector.next_offset)


async def kafka_standby(
    settings: Settings,
    group_id: str,
    data_dir: Path,
    *,
    client_id: str,
    lag_gauge: Any = None,
    logger: Any = None,
    only: Collection[int] | None = None,
    keyring: NodeKeyring | None,
) -> tuple[Standby, int]:
    """A started standby reading every partition of ``<ns>.events``, and how many there are."""
    topic = Topics(settings.namespace).events
    count = await partition_count(settings.bootstrap, topic, **dict(settings.kafka_options))
    reader = KafkaPartitionLog(settings, topic, range(count), client_id=f"{client_id}-standby")
    offsets = GroupOffsets(settings, group_id, topic)
    standby = Standby(
        reader,
        offsets,
        data_dir,
        lag_gauge=lag_gauge,
        logger=logger,
        open_state=kafka_reader(settings, Topics(settings.namespace).state, client_id),
        only=only,
        keyring=keyring,
    )
    await standby.start()
    return standby, count


def unowned(count: int, exclude: Collection[int]) -> list[int]:
    """Every partition of the topic that is not the node's own (nor opening as such)."""
    return [p for p in range(count) if p not in exclude]


def parse_partitions(text: str) -> frozenset[int]:
    """``"0,2,5-7"`` as partition numbers; ValueError saying what is wrong."""
    found: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, dash, last = part.partition("-")
        if not (first.isdigit() and (not dash or last.isdigit())):
            raise ValueError(f"{part!r} is not a partition number or a range like 2-5")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise ValueError(f"{part!r} ends before it starts")
        found.update(range(low, high + 1))
    if not found:
        raise ValueError("no partition given")
    return frozenset(found)
