"""History read from an archive directory: before the topic (rebuilds, audits) or instead of it.

``ArchiveThenLog`` is a ``ports.PartitionLog`` that reads a partition's archive files and then
the events topic from where they end, so the one restore path folds both; offsets that are in
neither (retention deleted them before they were archived) stop it with ``RestoreRefused``.
An audit from an archive folds the entity's archived events (and the topic's tail) with the
node's fold, as its index would have, and reads them with the audit's own readings.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from evsched.adapters.archive.files import archived_partitions, partition_events
from evsched.adapters.archive.history_file import LoggedEvent
from evsched.adapters.archive.partition_log import ArchivePartitionLog
from evsched.adapters.kafka.partition_log import KafkaPartitionLog, partition_for
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.adapters.proofs import NodeKeyring, node_keyring_from_env
from evsched.core.controls import target_of
from evsched.core.events import (
    EventFamily,
    EventTimeline,
    QueuePaused,
    SchedulePaused,
    entity_id,
)
from evsched.core.invariants import Replay
from evsched.core.routing import kinds
from evsched.core.state import TimelineEntry, Verdict
from evsched.errors import RestoreRefused
from evsched.operator.audit import Audit, audit_of
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.replay import positioned
from evsched.ports import PartitionLog, Record
from evsched.runtime.projection.refold import PausedAt
from evsched.settings import Settings

FETCH_RECORDS = 10_000
READ_WAIT_S = 0.5
# Queue and schedule controls and queue limits decide later verdicts of any job's events.
_CONTROL_KINDS = kinds(EventFamily.CONTROL, EventFamily.LIMIT)


class ArchiveThenLog:
    """Each partition from ``archive`` while it holds the offset asked for, then from ``log``."""

    def __init__(self, archive: ArchivePartitionLog, log: PartitionLog) -> None:
        self.archive = archive
        self.log = log
        self._in_log: set[int] = set()
        self._unchecked: dict[int, int] = {}  # partitions sought in the log, and from where

    async def start(self) -> None:
        await self.archive.start()
        await self.log.start()

    async def close(self) -> None:
        await self.archive.close()
        await self.log.close()

    def seek(self, partition: int, offset: int) -> None:
        first, end = self.archive.bounds(partition)
        if offset < end:
            if offset < first:
                raise RestoreRefused(
                    partition,
                    f"its archive starts at offset {first}, so offsets {offset}..{first - 1} "
                    "are not in it",
                )
            self._in_log.discard(partition)
            self.archive.seek(partition, offset)
        else:
            self._to_log(partition, offset)

    def _to_log(self, partition: int, offset: int) -> None:
        self._in_log.add(partition)
        self._unchecked[partition] = offset
        self.log.seek(partition, offset)

    async def position(self, partition: int) -> int:
        if partition not in self._in_log:
            at = await self.archive.position(partition)
            if at < self.archive.bounds(partition)[1]:
                return at
            self._to_log(partition, at)
        await self._check_start(partition)
        return await self.log.position(partition)

    async def _check_start(self, partition: int) -> None:
        """Refuse a partition whose log starts past where the archive (or the caller) left it."""
        wanted = self._unchecked.pop(partition, None)
        if wanted is None:
            return
        start = (await self.log.start_offsets([partition]))[partition]
        if start > wanted:
            raise RestoreRefused(
                partition,
                f"the history continues at offset {wanted} but the log starts at {start}: "
                f"offsets {wanted}..{start - 1} are neither archived nor in the log",
            )

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        logged = await self.log.start_offsets(partitions)
        return {
            p: self.archive.bounds(p)[0] if self.archive.bounds(p)[1] else logged[p]
            for p in partitions
        }

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        logged = await self.log.end_offsets(partitions)
        return {p: max(logged[p], self.archive.bounds(p)[1]) for p in partitions}

    async def read(
        self, partitions: Collection[int], timeout_s: float, max_records: int
    ) -> dict[int, list[Record]]:
        for partition in partitions:
            await self.position(partition)  # moves a partition whose archive is read to the log
        archived = [p for p in partitions if p not in self._in_log]
        if archived:
            return await self.archive.read(archived, 0, max_records)
        return await self.log.read(partitions, timeout_s, max_records)


def archive_history(root: Path) -> Iterator[LoggedEvent]:
    """Every archived record, by (partition, offset)."""
    for partition in range(archived_partitions(root)):
        yield from partition_events(root, partition)


@dataclass(frozen=True, slots=True, kw_only=True)
class Sources:
    """Where an audit from an archive read: the archive's offsets, the log's, and any gap."""

    partition: int
    archived: tuple[int, int]  # first offset and end (after the last record); (0, 0): none
    logged: tuple[int, int] | None = None  # the same for the log's tail read after the archive

    @property
    def gap(self) -> tuple[int, int] | None:
        """Offsets (first, last) in neither, when the log starts past the archive's end."""
        if self.logged is None or self.logged[0] <= self.archived[1]:
            return None
        return (self.archived[1], self.logged[0] - 1)

    @property
    def last_offset(self) -> int:
        ends = [self.archived[1]] + ([self.logged[1]] if self.logged else [])
        return max(ends) - 1

    def as_json(self) -> dict[str, object]:
        """Offsets as [first, last] (null: none), under ``history``."""
        return {
            "history": {
                "archive": _span(self.archived),
                "log": None if self.logged is None else _span(self.logged),
                "gap": None if self.gap is None else list(self.gap),
            }
        }

    def describe(self) -> str:
        archived = _span(self.archived)
        text = f"history of partition {self.partition}: archive " + (
            "empty" if archived is None else f"offsets {archived[0]}..{archived[1]}"
        )
        if self.logged is not None:
            logged = _span(self.logged)
            text += ", then the log " + (
                "has nothing more" if logged is None else f"offsets {logged[0]}..{logged[1]}"
            )
        if self.gap is not None:
            text += f" [red](offsets {self.gap[0]}..{self.gap[1]} are in neither)[/red]"
        return text


def _span(bounds: tuple[int, int]) -> list[int] | None:
    first, end = bounds
    return None if end <= first else [first, end - 1]


async def audit_from_archive(
    root: Path, entity: str, *, offline: bool, as_of: int | None = None
) -> tuple[Audit | None, Sources]:
    """``entity``'s audit from the archive at ``root``, then the topic after it (``offline``:
    the archive alone)."""
    settings = None if offline else Settings.from_env()
    partition, bounds = _locate(root, entity)
    sources = Sources(partition=partition, archived=bounds)
    tail: list[LoggedEvent] = []
    if settings is not None:
        tail, logged = await _log_tail(settings, partition, bounds[1], entity.encode())
        sources = Sources(partition=partition, archived=bounds, logged=logged)
    history = _chain(partition_events(root, partition), tail)
    stored, paused = _timeline(history, entity, node_keyring_from_env())
    found = audit_of(entity, partition, sources.last_offset, stored, as_of=as_of, paused=paused)
    return found, sources


def _locate(root: Path, entity: str) -> tuple[int, tuple[int, int]]:
    """The archive partition ``entity`` routes to, and the offsets the archive holds there."""
    if not root.is_dir():
        raise OperatorError(ExitCode.NOT_FOUND, f"no archive directory {root}")
    partition = partition_for(entity, archived_partitions(root))
    return partition, ArchivePartitionLog(root, "archive").bounds(partition)


async def _log_tail(
    settings: Settings, partition: int, start: int, needle: bytes
) -> tuple[list[LoggedEvent], tuple[int, int]]:
    """Records of ``partition`` from ``start`` to the log end holding ``needle``; the log's
    (first, end) offsets."""
    topic = Topics(settings.namespace).events
    count = await partition_count(settings.bootstrap, topic, **dict(settings.kafka_options))
    if partition >= count:
        raise RestoreRefused(partition, f"{topic} has {count} partitions, the archive more")
    found: list[LoggedEvent] = []
    log = KafkaPartitionLog(settings, topic, [partition], client_id="evsched-audit")
    async with log:
        first = (await log.start_offsets([partition]))[partition]
        end = (await log.end_offsets([partition]))[partition]
        log.seek(partition, start)
        while await log.position(partition) < end:
            batch = await log.read([partition], READ_WAIT_S, FETCH_RECORDS)
            records = (LoggedEvent.from_record(r) for r in batch.get(partition, []))
            found += [r for r in records if r.offset < end and _concerns(r, needle)]
    return found, (max(first, start), end)


def _chain(archived: Iterator[LoggedEvent], tail: Iterable[LoggedEvent]) -> Iterator[LoggedEvent]:
    end = -1
    for logged in archived:
        end = logged.offset
        yield logged
    for logged in tail:
        if logged.offset > end:
            yield logged


def _concerns(logged: LoggedEvent, needle: bytes) -> bool:
    """Whether ``logged`` may be the entity's event (ids are stored as UTF-8, so most records are
    skipped undecoded) or a control or limit, which decides the verdicts of later events."""
    return needle in logged.value or logged.kind in _CONTROL_KINDS


def _timeline(
    history: Iterable[LoggedEvent], entity: str, keyring: NodeKeyring | None = None
) -> tuple[list[tuple[TimelineEntry, bytes]], PausedAt]:
    """``entity``'s timeline folded from ``history`` as the projector would, and when its queue
    or it (a schedule) was paused."""
    replay = Replay()
    stored: list[tuple[TimelineEntry, bytes]] = []
    switches: dict[tuple[str, str], list[tuple[int, bool]]] = {}
    needle = entity.encode()
    walk = positioned(
        history, keyring, wanted=lambda logged: _concerns(logged, needle), in_order=True
    )
    for logged, event, position in walk:
        entry = replay.feed(event, position)
        if event.family is EventFamily.CONTROL:
            if entry.verdict is Verdict.APPLIED:
                on = isinstance(event, QueuePaused | SchedulePaused)
                switches.setdefault(target_of(event), []).append((logged.offset, on))
            if event.timeline is EventTimeline.QUEUE:
                continue  # a queue's pauses are on its own timeline, never a job's
        if entity_id(event) == entity:
            stored.append((entry, logged.value))

    def paused(target: str, name: str, offset: int) -> bool:
        before = [on for at, on in switches.get((target, name), []) if at < offset]
        return bool(before) and before[-1]

    return stored, paused
