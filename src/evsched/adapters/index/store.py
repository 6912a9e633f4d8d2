"""The RocksDB index of one events partition: job and schedule states, due queues, timelines.

Every change of a batch and the applied offset go into one WriteBatch, so state and offset can
never disagree. The index is a projection: deleting it and folding the log again rebuilds it byte
for byte (``digest`` compares two indexes). Key layout: ``projections/README.md``.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocksdict import BlockBasedOptions, Cache, Options, Rdict, ReadOptions, WriteBatch

from evsched.adapters import avro
from evsched.adapters.index.keys import (
    DUE,
    FOLLOWERS,
    JOBS,
    KEYS,
    LEASES,
    MARKS,
    ORPHANS,
    PERMIT_TIMELINE,
    PURGES,
    QUEUE_TIMELINE,
    REFUSED,
    RUN_MARKS,
    RUNS,
    SCHEDULE_TIMELINE,
    TIMELINE,
    U64,
    UNDECODABLE,
    job_timeline_prefix,
    keys_key,
    prefix_end,
    time_key,
    timeline_family,
    timeline_key,
)
from evsched.adapters.index.orphans import Orphan
from evsched.adapters.index.poison import PoisonBound
from evsched.adapters.index.priority import (
    BUILT,
    DUE_PRIORITY,
    DueEntry,
    PriorityLevels,
    priority_key,
    priority_value,
)
from evsched.adapters.index.purge import Purge, PurgeWriter
from evsched.adapters.index.runs import RunStart, RunWriter, runs_prefix
from evsched.adapters.index.tallies import TALLIES, add_tallies, read_tallies
from evsched.adapters.index.writes import Change, PreparedWrite, Recorder
from evsched.core import retention
from evsched.core.bounds import id_refusal
from evsched.core.controls import ControlState
from evsched.core.permits import LimitState
from evsched.core.state import ACTIVE_STATUSES, JobState, ScheduleState, Status, TimelineEntry
from evsched.errors import StoreError

SCHEDULES, CRON_DUE, META, CONTROLS = "schedules", "cron_due", "meta", "controls"
# A restore's staging area: the changelog's job records (a job's state and timeline in one
# value), the newest per job, unpacked into ``jobs`` and ``timeline`` once the whole changelog
# is read (``runtime.projection.changelog``). Empty in every index but a restore's scratch one.
STAGED_JOBS = "staged_jobs"
COLUMN_FAMILIES = (
    JOBS, DUE, LEASES, TIMELINE, KEYS, SCHEDULES, CRON_DUE, UNDECODABLE, REFUSED, CONTROLS,
    PURGES, MARKS, META, DUE_PRIORITY, TALLIES, ORPHANS, FOLLOWERS, RUNS, RUN_MARKS, STAGED_JOBS,
)  # fmt: skip
# What the digest covers: everything the fold derives, in a fixed order.
DIGEST_FAMILIES = (
    JOBS, DUE, LEASES, TIMELINE, KEYS, SCHEDULES, CRON_DUE, UNDECODABLE, REFUSED, CONTROLS,
    PURGES, MARKS, TALLIES, ORPHANS, FOLLOWERS, RUNS, RUN_MARKS,
)  # fmt: skip
# Keyed by an 8-byte big-endian time, then the entity id (``orphans``, ``run_marks``: then an
# offset).
TIME_FAMILIES = (DUE, LEASES, CRON_DUE, PURGES, MARKS, ORPHANS, RUN_MARKS)
# Derived from the job and schedule states alone: a restore rebuilds them instead of reading
# them from the changelog (they change on most events; every other family is mirrored). Purge
# marks outlive their jobs, so they are mirrored. ``keys`` is a job's idempotency key, so it is
# derived too (changelog format 2; format 1 mirrored it).
DERIVED_FAMILIES = frozenset((DUE, LEASES, CRON_DUE, PURGES, META, DUE_PRIORITY, KEYS, STAGED_JOBS))
NEVER = (1 << 64) - 1
# A due scan reads at most this many times its limit in keys while skipping held-back jobs.
SKIP_READS = 10

APPLIED_OFFSET = b"applied_offset"
FOLD_VERSION = b"fold_version"
_I64 = struct.Struct(">q")


# The ``controls`` keys of queues' concurrency limits (core.permits): ``l``, the queue name.
LIMIT_PREFIX = b"l"


def control_key(target: str, name: str) -> bytes:
    """The ``controls`` key of a queue's or a schedule's pause switch: ``q`` or ``s``, the name."""
    return (QUEUE_TIMELINE if target == "queue" else SCHEDULE_TIMELINE) + name.encode()


def limit_key(name: str) -> bytes:
    """The ``controls`` key of a limit: ``l``, its name (a queue, or ``key:`` and a key)."""
    return LIMIT_PREFIX + name.encode()


def keyable(entity_id: str) -> bool:
    """Whether ``entity_id`` can key a timeline; the fold refuses every event of any other id."""
    return id_refusal("id", entity_id) is None


@dataclass(slots=True)
class IndexBatch:
    """Changes folded from a run of records, applied in one WriteBatch by ``PartitionIndex.write``.

    ``jobs``/``schedules`` map ids to the newest state; ``before_*`` keep the stored state at the
    start of the batch so due and lease entries are moved once, however many events touched a job.
    """

    jobs: dict[str, JobState] = field(default_factory=dict)
    before_jobs: dict[str, JobState | None] = field(default_factory=dict)
    schedules: dict[str, ScheduleState] = field(default_factory=dict)
    before_schedules: dict[str, ScheduleState | None] = field(default_factory=dict)
    timeline: list[tuple[str, TimelineEntry, bytes]] = field(default_factory=list)
    undecodable: list[tuple[TimelineEntry, bytes]] = field(default_factory=list)
    controls: dict[bytes, ControlState] = field(default_factory=dict)
    limits: dict[bytes, LimitState] = field(default_factory=dict)
    # Applied purges in log order; a purged job is in ``before_jobs`` and, until enqueued again
    # in the same batch, not in ``jobs``.
    purges: list[Purge] = field(default_factory=list)
    # What the batch adds to the partition's lifetime tallies (core.tallies), by name.
    tallies: dict[str, int] = field(default_factory=dict)
    # Entries that expire on marks, in log order (index_orphans): rejected events of jobs and
    # schedules the index does not hold, and limits' permit steps.
    orphans: list[Orphan] = field(default_factory=list)
    # New runs of reused ids in log order (index_runs): their earlier runs leave on marks.
    runs: list[RunStart] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.jobs
            or self.schedules
            or self.timeline
            or self.undecodable
            or self.controls
            or self.limits
            or self.purges
            or self.tallies
            or self.orphans
            or self.runs
        )


class PartitionIndex:
    """One RocksDB (raw mode, one column family per index) for one events partition."""

    def __init__(self, path: Path, partition: int) -> None:
        self.path = path
        self.partition = partition
        path.mkdir(parents=True, exist_ok=True)
        options = _options()
        families = {name: _options() for name in COLUMN_FAMILIES}
        try:
            self._db = Rdict(str(path), options, column_families=families)
        except Exception as exc:
            raise StoreError(f"cannot open index at {path}: {exc}") from exc
        self._cf = {name: self._db.get_column_family(name) for name in COLUMN_FAMILIES}
        self._handles = {name: self._db.get_column_family_handle(name) for name in COLUMN_FAMILIES}
        self._mirrored = {
            id(handle): name
            for name, handle in self._handles.items()
            if name not in DERIVED_FAMILIES
        }
        # Per time-ordered family, a time no live key is below. Due entries, leases and cron slots
        # are deleted as jobs move on, and RocksDB keeps the tombstones until compaction: a scan
        # from the start would step over every one of them, on every step. Scans start here
        # instead; writes lower it, scans raise it to the first live key they meet.
        self._low = dict.fromkeys(TIME_FAMILIES, 0)
        self._fill_priorities()
        self._poison = PoisonBound(self)
        self._levels = PriorityLevels(lambda start, end: self._scan(DUE_PRIORITY, start, end))

    # --- reads -----------------------------------------------------------------------------

    def applied_offset(self) -> int:
        """The offset of the last record folded into this index, or -1 when empty."""
        raw = self._cf[META].get(APPLIED_OFFSET)
        return -1 if raw is None else int(_I64.unpack(raw)[0])

    def fold_version(self) -> int | None:
        raw = self._cf[META].get(FOLD_VERSION)
        return None if raw is None else int(U64.unpack(raw)[0])

    def job(self, job_id: str) -> JobState | None:
        raw = self._cf[JOBS].get(job_id.encode())
        return None if raw is None else avro.decode_state(raw, JobState)

    def schedule(self, schedule_id: str) -> ScheduleState | None:
        raw = self._cf[SCHEDULES].get(schedule_id.encode())
        return None if raw is None else avro.decode_state(raw, ScheduleState)

    def control(self, target: str, name: str) -> ControlState | None:
        """A queue's (target "queue") or a schedule's pause switch, None if never paused."""
        raw = self._cf[CONTROLS].get(control_key(target, name))
        return None if raw is None else avro.decode_state(raw, ControlState)

    def controls(self) -> Iterator[ControlState]:
        """Every pause switch this partition folded (paused or resumed), queues first."""
        for key, value in self._scan(CONTROLS):
            if not key.startswith(LIMIT_PREFIX):
                yield avro.decode_state(value, ControlState)

    def limit(self, name: str) -> LimitState | None:
        """A limit (a queue name, or ``key:`` and a key) as this partition folded it, or None."""
        raw = self._cf[CONTROLS].get(limit_key(name))
        return None if raw is None else avro.decode_state(raw, LimitState)

    def limits(self) -> Iterator[LimitState]:
        """Every queue limit this partition folded (core.permits), by queue name."""
        for _, value in self._scan(CONTROLS, LIMIT_PREFIX, prefix_end(LIMIT_PREFIX)):
            yield avro.decode_state(value, LimitState)

    def queue_timeline_events(self, queue: str) -> list[tuple[TimelineEntry, bytes]]:
        """The pauses and resumes of ``queue`` and the settings of its limit (or of the limit
        ``key:`` and a key) folded on this partition, in log order; never a permit step."""
        if not keyable(queue):
            return []
        return self._timeline_under(timeline_key(queue, 0, family=QUEUE_TIMELINE)[:-8])

    def permit_timeline_events(self, limit: str) -> list[tuple[TimelineEntry, bytes]]:
        """The permit steps (``QueuePermit``) of ``limit`` this partition keeps, in log order:
        at its home, those of the last 7 days of log time (``index_orphans``)."""
        if not keyable(limit):
            return []
        return self._timeline_under(timeline_key(limit, 0, family=PERMIT_TIMELINE)[:-8])

    def due_by_priority(
        self, now: int, limit: int, *, skip: Callable[[str], bool] | None = None
    ) -> list[str]:
        """Scheduled jobs with ``run_at <= now`` in lease order: highest priority first, then
        earliest run_at (``index_priority``); reads only due keys.

        Jobs ``skip`` holds back (e.g. on an undeclared queue) do not count toward ``limit``,
        so they can't hide the jobs due after them; at most ``SKIP_READS * limit`` keys are read.
        """
        return self._levels.due(now, limit, skip=skip, max_reads=limit * SKIP_READS)

    def due_entries(
        self, now: int, limit: int, *, skip: Callable[[DueEntry], bool] | None = None
    ) -> list[DueEntry]:
        """``due_by_priority`` as entries that also name each job's queue: the same keys are
        read and the same jobs returned, and no job's state is decoded."""
        return self._levels.entries(now, limit, skip=skip, max_reads=limit * SKIP_READS)

    def expired_lease_ids(self, now: int, limit: int) -> list[str]:
        return self._ids_until(LEASES, now, limit)

    def due_schedule_ids(
        self, now: int, limit: int, *, skip: Callable[[str], bool] | None = None
    ) -> list[str]:
        return self._ids_until(CRON_DUE, now, limit, skip)

    def due_purge_ids(self, now: int, limit: int) -> list[str]:
        """Finished jobs whose retention ran out by ``now``, earliest first."""
        return self._ids_until(PURGES, now, limit)

    def next_due_at(self, after: int = -1, *, due_lead_ms: int = 0) -> int | None:
        """The earliest time after ``after`` that anything here becomes due (run_at, lease end,
        cron slot, purge); what is due by ``after`` already is the caller's to act on.

        Jobs count as due ``due_lead_ms`` before their run_at (they are pre-leased).
        """
        first_run = self._first_time(DUE, after + 1 + due_lead_ms)
        firsts = [self._first_time(name, after + 1) for name in (LEASES, CRON_DUE, PURGES)]
        firsts.append(None if first_run is None else first_run - due_lead_ms)
        times = [t for t in firsts if t is not None]
        return min(times) if times else None

    def timeline(self, entity_id: str, *, schedule: bool | None = None) -> list[TimelineEntry]:
        """Every event of a job (or schedule) as the fold judged it, in log order.

        ``schedule`` picks the schedule's (True) or the job's (False) timeline; None gives the
        job's, or the schedule's when no job event has this id. They are never mixed.
        """
        return [entry for entry, _ in self.timeline_events(entity_id, schedule=schedule)]

    def timeline_page(
        self, entity_id: str, *, schedule: bool, after: int = -1, limit: int
    ) -> list[TimelineEntry]:
        """At most ``limit`` entries of a job's (or schedule's) timeline past offset ``after``,
        in log order: a page read without the entries before it."""
        if not keyable(entity_id):
            return []
        start = timeline_key(entity_id, max(0, after + 1), schedule=schedule)
        scan = self._scan(TIMELINE, start, prefix_end(start[:-8]))
        return [
            avro.decode_timeline(_split_entry(value)[0])
            for _, value in itertools.islice(scan, limit)
        ]

    def timeline_events(
        self, entity_id: str, *, schedule: bool | None = None
    ) -> list[tuple[TimelineEntry, bytes]]:
        """The timeline with each event's bytes as written, so audits can refold to any offset."""
        if not keyable(entity_id):
            return []  # its events are in the refused family, by offset
        if schedule is None:
            found = self.timeline_events(entity_id, schedule=False)
            return found or self.timeline_events(entity_id, schedule=True)
        return self._timeline_under(timeline_key(entity_id, 0, schedule=schedule)[:-8])

    def run_base(self, job_id: str) -> tuple[int, JobState] | None:
        """Where the job's kept timeline starts when earlier runs of it left (``index_runs``):
        the first kept run's first offset and the job's state just before it; else None."""
        if not keyable(job_id):
            return None
        prefix = runs_prefix(job_id)
        for key, value in self._scan(RUNS, prefix, prefix_end(prefix)):
            boundary = int(U64.unpack(key[-8:])[0])
            first = next(iter(self._scan(TIMELINE, *_job_range(job_id))), None)
            if first is None or int(U64.unpack(first[0][-8:])[0]) < boundary:
                return None  # the run before it is still kept: a refold starts from nothing
            return boundary, avro.decode_state(value[8:], JobState)
        return None

    def _timeline_under(self, prefix: bytes) -> list[tuple[TimelineEntry, bytes]]:
        return [
            (avro.decode_timeline(entry), raw)
            for entry, raw in (
                _split_entry(value) for _, value in self._scan(TIMELINE, prefix, prefix_end(prefix))
            )
        ]

    def undecodable(self) -> list[TimelineEntry]:
        """The newest ``POISON_KEPT`` undecodable records (``index_poison``), by offset."""
        return [avro.decode_timeline(_split_entry(v)[0]) for _, v in self._scan(UNDECODABLE)]

    def undecodable_records(self, after: int = -1) -> Iterator[tuple[TimelineEntry, bytes]]:
        """Undecodable records after offset ``after``, lazily in offset order, with their bytes.

        Only the newest ``POISON_KEPT`` are kept: past an ``after`` that was trimmed since, the
        next one is the oldest kept (older ones are on the log from their offset)."""
        start = U64.pack(after + 1) if after >= 0 else b""
        for _, value in self._scan(UNDECODABLE, start):
            entry, raw = _split_entry(value)
            yield avro.decode_timeline(entry), raw

    def refused(self) -> list[tuple[TimelineEntry, bytes]]:
        """Events refused for an id that cannot key a timeline (too long, empty), by offset:
        the newest ``POISON_KEPT`` of them (``index_poison``)."""
        return [
            (avro.decode_timeline(entry), raw)
            for entry, raw in (_split_entry(v) for _, v in self._scan(REFUSED))
        ]

    def tallies(self) -> dict[str, int]:
        """This partition's lifetime tallies (core.tallies) by name; one never counted is absent."""
        return read_tallies(self._scan(TALLIES))

    def jobs(self, after: str | None = None) -> Iterator[JobState]:
        """Every job, lazily, in id byte order; only ids above ``after`` when given (paging)."""
        for _, value in self._scan(JOBS, _start_after(after)):
            yield avro.decode_state(value, JobState)

    def schedules(self, after: str | None = None) -> Iterator[ScheduleState]:
        for _, value in self._scan(SCHEDULES, _start_after(after)):
            yield avro.decode_state(value, ScheduleState)

    def in_flight_by_queue(self) -> dict[str, int]:
        """Leased and running jobs per queue, counted from the lease index."""
        counts: dict[str, int] = {}
        for key, _ in self._scan(LEASES):
            state = self.job(key[8:].decode())
            if state is not None and state.status in ACTIVE_STATUSES:
                counts[state.queue] = counts.get(state.queue, 0) + 1
        return counts

    def digest(self) -> str:
        """SHA-256 over every derived key and value and the applied offset: equal iff same index."""
        h = hashlib.sha256()
        for name in DIGEST_FAMILIES:
            h.update(name.encode() + b"\x00")
            for key, value in self._scan(name):
                h.update(U64.pack(len(key)) + key + U64.pack(len(value)) + value)
        h.update(_I64.pack(self.applied_offset()))
        return h.hexdigest()

    # --- writes ----------------------------------------------------------------------------

    def write(self, batch: IndexBatch, applied_offset: int, fold_version: int) -> None:
        """Apply every change of ``batch`` and the new applied offset atomically."""
        self.apply(self.prepare(batch, applied_offset, fold_version, record=False))

    def prepare(
        self, batch: IndexBatch, applied_offset: int, fold_version: int, *, record: bool = True
    ) -> PreparedWrite:
        """The writes of ``batch``, not applied (``apply`` does that); listed in ``changes``
        unless ``record`` is False (no changelog to feed).

        Timeline entries go first, so a purge later in the batch deletes those of its job; then
        the purges and the orphans (``index_orphans``), in log order; then the earlier runs of
        reused ids that leave (``index_runs``), in log order; then the states (a job
        enqueued again after its purge is new). The undecodable and refused records keep only
        the newest of their kind (``index_poison``).
        """
        wb = Recorder(self._mirrored if record else {})
        on_applied = self._poison.write(wb, self._put_timeline(wb, batch))
        if batch.purges or batch.orphans:
            PurgeWriter(self, wb, batch.purges, batch.timeline, batch.orphans).write()
        RunWriter(self, wb, batch.runs, batch.purges, batch.timeline).write()
        for job_id, state in batch.jobs.items():
            self._put_job(wb, batch.before_jobs.get(job_id), state)
        for schedule_id, schedule in batch.schedules.items():
            self._put_schedule(wb, batch.before_schedules.get(schedule_id), schedule)
        add_tallies(self._cf[TALLIES].get, wb, self._h(TALLIES), batch.tallies)
        return PreparedWrite(wb, applied_offset, fold_version, on_applied)

    def apply(self, prepared: PreparedWrite) -> None:
        """Write a prepared batch and its applied offset and fold version in one WriteBatch."""
        wb = prepared.recorder.batch
        wb.put(APPLIED_OFFSET, _I64.pack(prepared.applied_offset), self._h(META))
        wb.put(FOLD_VERSION, U64.pack(prepared.fold_version), self._h(META))
        try:
            self._db.write(wb)
        except Exception as exc:
            raise StoreError(f"index write failed at {self.path}: {exc}") from exc
        for applied in prepared.on_applied:
            applied()

    def _put_timeline(self, wb: Recorder, batch: IndexBatch) -> dict[str, list[tuple[int, bytes]]]:
        """Put the batch's timeline entries and controls; the undecodable and refused records
        are returned by family, as (offset, value), for ``index_poison`` to write."""
        poison: dict[str, list[tuple[int, bytes]]] = {UNDECODABLE: [], REFUSED: []}
        for entity_id, entry, raw in batch.timeline:
            value = _join_entry(avro.encode_timeline(entry), raw)
            if keyable(entity_id):
                key = timeline_key(entity_id, entry.offset, family=timeline_family(entry.kind))
                wb.put(key, value, self._h(TIMELINE))
            else:
                poison[REFUSED].append((entry.offset, value))
        for key, control in batch.controls.items():
            wb.put(key, avro.encode_state(control), self._h(CONTROLS))
        for key, limit in batch.limits.items():
            wb.put(key, avro.encode_state(limit), self._h(CONTROLS))
        for entry, raw in batch.undecodable:
            value = _join_entry(avro.encode_timeline(entry), raw)
            poison[UNDECODABLE].append((entry.offset, value))
        return poison

    def delete_secondary(self, wb: Recorder, state: JobState) -> None:
        """Delete the due, lease and purge entries that ``state`` has in the index."""
        key = state.job_id
        if state.status is Status.SCHEDULED:
            wb.delete(time_key(state.run_at, key), self._h(DUE))
            wb.delete(priority_key(state.priority, state.run_at, key), self._h(DUE_PRIORITY))
        if state.lease_until is not None:
            wb.delete(time_key(state.lease_until, key), self._h(LEASES))
        purge_at = retention.purge_at(state)
        if purge_at is not None:
            wb.delete(time_key(purge_at, key), self._h(PURGES))

    def _put_job(self, wb: Recorder, before: JobState | None, state: JobState) -> None:
        key = state.job_id
        if before is not None:
            self.delete_secondary(wb, before)
        self._put_job_times(wb, state)
        if state.idempotency_key is not None and (
            before is None or keys_key(before) != keys_key(state)
        ):
            if before is not None and before.idempotency_key is not None:
                wb.delete(keys_key(before), self._h(KEYS))
            wb.put(keys_key(state), key.encode(), self._h(KEYS))
        wb.put(key.encode(), avro.encode_state(state), self._h(JOBS))

    def _put_job_times(self, wb: Recorder, state: JobState) -> None:
        """The due, lease and purge entries of ``state`` (all derived from it)."""
        if (purge_at := retention.purge_at(state)) is not None:
            wb.put(time_key(purge_at, state.job_id), b"", self._h(PURGES))
            self._lower(PURGES, purge_at)
        if state.status is Status.SCHEDULED:
            wb.put(time_key(state.run_at, state.job_id), b"", self._h(DUE))
            self._lower(DUE, state.run_at)
            key = priority_key(state.priority, state.run_at, state.job_id)
            wb.put(key, priority_value(state), self._h(DUE_PRIORITY))
            self._levels.lower(state.priority, state.run_at)
        if state.lease_until is not None:
            key = time_key(state.lease_until, state.job_id)
            wb.put(key, U64.pack(state.token), self._h(LEASES))
            self._lower(LEASES, state.lease_until)

    def _put_schedule(
        self, wb: Recorder, before: ScheduleState | None, schedule: ScheduleState
    ) -> None:
        sid = schedule.schedule_id
        if before is not None and before.next_fire_at is not None:
            wb.delete(time_key(before.next_fire_at, sid), self._h(CRON_DUE))
        self._put_schedule_time(wb, schedule)
        wb.put(sid.encode(), avro.encode_state(schedule), self._h(SCHEDULES))

    def _put_schedule_time(self, wb: Recorder, schedule: ScheduleState) -> None:
        if schedule.next_fire_at is not None:
            wb.put(time_key(schedule.next_fire_at, schedule.schedule_id), b"", self._h(CRON_DUE))
            self._lower(CRON_DUE, schedule.next_fire_at)

    # --- a changelog's side ----------------------------------------------------------------

    def get(self, name: str, key: bytes) -> bytes | None:
        """The value of ``key`` in column family ``name``, as stored."""
        value: bytes | None = self._cf[name].get(key)
        return value

    def job_records(
        self, job_ids: Iterable[bytes]
    ) -> Iterator[tuple[bytes, bytes | None, list[tuple[bytes, bytes]]]]:
        """Each job's stored state (None: none) and timeline entries, as (key suffix past the
        job's prefix, value): one iterator for them all, seeked per job (ids best sorted)."""
        cursor = self._cf[TIMELINE].iter(ReadOptions())
        jobs = self._cf[JOBS]
        for job_id in job_ids:
            prefix = job_timeline_prefix(job_id)
            entries: list[tuple[bytes, bytes]] = []
            cursor.seek(prefix)
            while cursor.valid() and (key := cursor.key()).startswith(prefix):
                entries.append((key[len(prefix) :], cursor.value()))
                cursor.next()
            yield job_id, jobs.get(job_id), entries

    def mirrored(self) -> Iterator[Change]:
        """Every key of the mirrored families: what a changelog holds for this index."""
        for name in COLUMN_FAMILIES:
            if name not in DERIVED_FAMILIES:
                for key, value in self._scan(name):
                    yield name, key, value

    def load(self, changes: Iterable[Change]) -> None:
        """Write changes read from a changelog as they are, in one WriteBatch."""
        wb = WriteBatch(raw_mode=True)
        for name, key, value in changes:
            if name not in self._handles or (name in DERIVED_FAMILIES and name != STAGED_JOBS):
                raise StoreError(f"a changelog record names no mirrored column family: {name!r}")
            if value is None:
                wb.delete(key, self._h(name))
            else:
                wb.put(key, value, self._h(name))
        self._db.write(wb)
        self._poison.forget()

    def finish_load(self, applied_offset: int, fold_version: int) -> None:
        """Derive the time families and the idempotency keys from the loaded states, and set
        the applied offset."""
        wb = Recorder({})
        for state in self.jobs():
            self._put_job_times(wb, state)
            if state.idempotency_key is not None:
                wb.put(keys_key(state), state.job_id.encode(), self._h(KEYS))
        for schedule in self.schedules():
            self._put_schedule_time(wb, schedule)
        self.apply(PreparedWrite(wb, applied_offset, fold_version))

    def _fill_priorities(self) -> None:
        """An index from before ``due_priority``: file its scheduled jobs there, once."""
        if self._cf[META].get(BUILT) is not None:
            return
        wb = WriteBatch(raw_mode=True)
        for count, (due, _) in enumerate(self._scan(DUE), start=1):
            state = self.job(due[8:].decode())
            if state is not None and state.status is Status.SCHEDULED:
                key = priority_key(state.priority, state.run_at, state.job_id)
                wb.put(key, priority_value(state), self._h(DUE_PRIORITY))
            if count % 10_000 == 0:  # a deep backlog fills in bounded batches; puts repeat safely
                self._db.write(wb)
                wb = WriteBatch(raw_mode=True)
        wb.put(BUILT, b"\x01", self._h(META))
        self._db.write(wb)

    def close(self) -> None:
        # Column-family handles keep the DB locked after close(): drop them first.
        self._cf.clear()
        self._handles.clear()
        self._db.close()

    # --- helpers ---------------------------------------------------------------------------

    def h(self, name: str) -> Any:
        """The handle of column family ``name``, for a WriteBatch."""
        return self._handles[name]

    _h = h

    def scan(
        self, name: str, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Keys and values of ``name`` from ``start`` up to ``end`` (excluded), in key order."""
        return self._scan(name, start, end)

    def last(self, name: str, prefix: bytes) -> tuple[bytes, bytes] | None:
        """The last key of ``name`` starting with ``prefix``, and its value; None if none."""
        cursor = self._cf[name].iter(ReadOptions())
        cursor.seek_for_prev(prefix_end(prefix))
        if cursor.valid() and (key := cursor.key()).startswith(prefix):
            return key, cursor.value()
        return None

    def ranges(self, name: str) -> Callable[[bytes, bytes], Iterator[bytes]]:
        """The keys of ``name`` in ``[start, end)``, range after range through one iterator.

        Creating a RocksDB iterator costs far more than a seek (~1 ms against ~30 µs on a large
        index, one child per memtable and table file): a batch of purges seeks one it made once.
        Each range must be read whole before the next is asked for.
        """
        cursor = self._cf[name].iter(ReadOptions())

        def keys(start: bytes, end: bytes) -> Iterator[bytes]:
            cursor.seek(start)
            while cursor.valid() and (key := cursor.key()) < end:
                yield key
                cursor.next()

        return keys

    def _scan(
        self, name: str, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        read = ReadOptions()
        if end is not None:
            read.set_iterate_upper_bound(end)
        yield from self._cf[name].items(from_key=start, read_opt=read)

    def _ids_until(
        self, name: str, now: int, limit: int, skip: Callable[[str], bool] | None = None
    ) -> list[str]:
        now = max(0, now)
        low = self._low[name]
        if low > now:
            return []  # no RocksDB call at all while nothing is due
        found: list[str] = []
        first: int | None = None
        scan = self._scan(name, U64.pack(low), U64.pack(now + 1))
        for reads, (key, _) in enumerate(scan, start=1):
            if first is None:
                first = int(U64.unpack(key[:8])[0])
            entity = key[8:].decode()
            if skip is None or not skip(entity):
                found.append(entity)
            if len(found) >= limit or reads >= limit * SKIP_READS:
                break
        self._low[name] = now + 1 if first is None else first
        return found

    def _first_time(self, name: str, at_least: int) -> int | None:
        at_least = max(0, at_least)
        low = self._low[name]
        for key, _ in self._scan(name, U64.pack(max(at_least, low))):
            first = int(U64.unpack(key[:8])[0])
            if at_least <= low:
                self._low[name] = first
            return first
        if at_least <= low:
            self._low[name] = NEVER
        return None

    def low(self, name: str) -> int:
        """A time no live key of the time-ordered family ``name`` is below."""
        return self._low[name]

    def lower(self, name: str, at: int) -> None:
        """A key of ``name`` at ``at`` is being written."""
        self._lower(name, at)

    def raise_low(self, name: str, at: int) -> None:
        """Every key of ``name`` below ``at`` is deleted (by the batch being written)."""
        self._low[name] = max(self._low[name], at)

    def _lower(self, name: str, at: int) -> None:
        if at < self._low[name]:
            self._low[name] = max(0, at)


# Memory stays flat as jobs accumulate: memtables are capped per index, and every index of the
# process shares one block cache that also holds index and filter blocks (RocksDB's defaults give
# each column family its own 64 MB memtable and its own cache, so RSS grew with the job count).
WRITE_BUFFER_BYTES = 4 << 20
INDEX_WRITE_BUFFERS_BYTES = 8 << 20
_BLOCK_CACHE = Cache(8 << 20)
# Disk stays flat too. RocksDB's own files outside the data grow for ever by default: its info
# LOG takes a few lines per flush and compaction and never rolls (the 3M-job soak measured about
# 1.3 MB a minute per process, a third of the index's disk after 30 minutes), and its MANIFEST
# takes an edit per flush and compaction until 1 GB. Both are bounded here: the info log rolls at
# this size and keeps this many old files, and the MANIFEST is rewritten from the live state
# once it passes its bound.
INFO_LOG_BYTES = 1 << 20
INFO_LOGS_KEPT = 2
MANIFEST_BYTES = 4 << 20
# A write-ahead log file is deleted only once every family has flushed what it holds, and a
# quiet family (undecodable records, schedules) flushes rarely: by default RocksDB lets the logs
# reach four times all the families' memtables before it forces that flush. Past this total the
# oldest log's families are flushed, so the logs stay bounded whatever the write mix (the 3M-job
# soak measured 12-25 MB of them over six indexes, below the bound).
WAL_BYTES = 2 * INDEX_WRITE_BUFFERS_BYTES


def _options() -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_db_write_buffer_size(INDEX_WRITE_BUFFERS_BYTES)
    options.set_max_log_file_size(INFO_LOG_BYTES)
    options.set_keep_log_file_num(INFO_LOGS_KEPT)
    options.set_max_manifest_file_size(MANIFEST_BYTES)
    options.set_max_total_wal_size(WAL_BYTES)
    table = BlockBasedOptions()
    table.set_block_cache(_BLOCK_CACHE)
    table.set_cache_index_and_filter_blocks(True)
    # A new job's lookup finds nothing: bloom filters answer that without reading every level.
    table.set_bloom_filter(10, False)
    options.set_block_based_table_factory(table)
    return options


def _job_range(job_id: str) -> tuple[bytes, bytes]:
    """The ``timeline`` keys of a job's entries: from its first possible key to past its last."""
    prefix = timeline_key(job_id, 0)[:-8]
    return prefix, prefix_end(prefix)


def _start_after(entity: str | None) -> bytes:
    """The smallest key above ``entity`` in an id-keyed column family (all keys when None)."""
    return b"" if entity is None else entity.encode() + b"\x00"


def _join_entry(entry: bytes, raw: bytes) -> bytes:
    """A timeline entry and the record's bytes as written: 8-byte BE entry length, entry, raw."""
    return U64.pack(len(entry)) + entry + raw


def _split_entry(value: bytes) -> tuple[bytes, bytes]:
    size = int(U64.unpack(value[:8])[0])
    return value[8 : 8 + size], value[8 + size :]
