"""The projector: decodes a partition's records and folds them into an index batch.

Used by nodes (which also emit) and read replicas and rebuilds (which never emit). Undecodable
bytes are recorded with their position and skipped; nothing here can crash on a record's content.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import assert_never

from evsched.adapters import avro
from evsched.adapters.index.keys import timeline_family
from evsched.adapters.index.orphans import Orphan
from evsched.adapters.index.purge import Purge
from evsched.adapters.index.runs import RunStart
from evsched.adapters.index.store import IndexBatch, PartitionIndex, control_key, keyable, limit_key
from evsched.adapters.index.writes import PreparedWrite
from evsched.adapters.proofs import NodeKeyring, PartitionProofs, proof_of
from evsched.core import retention
from evsched.core.controls import (
    QUEUE,
    SCHEDULE,
    ControlState,
    fold_control,
    fold_job,
    fold_schedule_guarded,
    target_exists,
    target_of,
)
from evsched.core.events import (
    AttemptSucceeded,
    ControlEvent,
    Effect,
    Event,
    EventFamily,
    JobEvent,
    LimitEvent,
    ParentResolved,
    PermitEvent,
    Position,
    QueuePermit,
    ScheduleEvent,
)
from evsched.core.fold import FOLD_VERSION
from evsched.core.permits import (
    LimitState,
    fold_limit,
    fold_permit,
    guard_job,
    limit_name,
    limit_names,
)
from evsched.core.state import (
    ACTIVE_STATUSES,
    FoldedEvent,
    JobState,
    ScheduleState,
    Status,
    TimelineEntry,
    Verdict,
)
from evsched.core.tallies import PROOFS_REQUIRED, tallied
from evsched.core.workflow import waits as workflows
from evsched.errors import DecodeError
from evsched.ports import Record


@dataclass(frozen=True, slots=True)
class AcceptedEffect:
    """An effect of an applied success: published once, keyed by job id and token."""

    job_id: str
    token: int
    index: int
    effect: Effect


# Called with the records of each committed batch, once they are in the index; must not raise.
CommitHook = Callable[[Sequence[FoldedEvent]], None]


@dataclass(slots=True)
class Folded:
    """What folding a run of records produced, before it is committed to the index."""

    batch: IndexBatch = field(default_factory=IndexBatch)
    last_offset: int | None = None
    effects: list[AcceptedEffect] = field(default_factory=list)
    # Sent like effects, with the offset of the records whose fold resolved a parent.
    resolutions: list[ParentResolved] = field(default_factory=list)
    # Permit steps to forward to another partition (core.permits): sent like effects, with the
    # offset of the records they came from.
    forwards: list[Event] = field(default_factory=list)
    seen_event_ids: set[str] = field(default_factory=set)
    verdicts: list[tuple[str, Verdict]] = field(default_factory=list)
    # When the lease of each leased or running job the batch leaves ends (epoch ms), by job id.
    lease_ends: dict[str, int] = field(default_factory=dict)
    # Filled only when the projector has an ``on_commit`` hook.
    observed: list[FoldedEvent] = field(default_factory=list)

    def lease_ended(self, now: int) -> bool:
        """Whether a lease the batch leaves is already over by ``now`` (the node's clock)."""
        return any(until <= now for until in self.lease_ends.values())


# Committed job states kept decoded per partition: most events touch a job that a recent batch
# wrote (lease, start, success follow the enqueue within moments), and reading those back from
# RocksDB and decoding them was a sixth of a node's time. Bounded, so memory stays flat.
STATE_CACHE_SIZE = 2_048


class Projector:
    """Folds records of one partition on top of its index, tracking in-flight jobs per queue."""

    def __init__(
        self,
        index: PartitionIndex,
        *,
        cache_size: int = STATE_CACHE_SIZE,
        on_commit: CommitHook | None = None,
        source: str = "node",
        keyring: NodeKeyring | None = None,
    ) -> None:
        self.index = index
        # What records prove (core.roles), checked with the node keys when this process has
        # them: every process that folds the same log must use the same keys to reach the same
        # index, so each reads them once at its start (EVSCHED_NODE_KEY...) and passes them in.
        required = index.tallies().get(PROOFS_REQUIRED, 0) > 0
        self.proofs = PartitionProofs(keyring, required=required)
        self.source = source  # who the resolutions it makes are from
        # Told what each committed batch folded (metrics count verdicts without a second fold).
        self.on_commit = on_commit
        # Leased or running jobs per queue, and leased ones no worker started yet.
        self.in_flight: dict[str, int] = {}
        self.unstarted: dict[str, int] = {}
        # Leased jobs a worker started, per queue, since this projector opened (never decreases):
        # the node's lease budget reads the start rate from it.
        self.started: dict[str, int] = {}
        self._seed_counts()
        # Paused queues and schedules of this partition as the index holds them (a handful):
        # leases and fires skip them. Changed on commit only, so a dropped batch leaves no trace.
        self._paused: dict[str, set[str]] = {QUEUE: set(), SCHEDULE: set()}
        self._paused_apply(index.controls())
        # Queue limits this partition folded (a handful): leases of their jobs need permits.
        # Committed state only, like the pause sets: a fold reads them through its batch.
        self.limits: dict[str, LimitState] = {s.name: s for s in index.limits()}
        # Only ever what the index holds (filled on read and on commit), so reads stay exact.
        self._cache: dict[str, JobState] = {}
        self._cache_size = cache_size
        # A consumer may hand the same records out twice (a seek racing a prefetch): a record is
        # folded only once, whatever the caller passes in.
        self.next_offset = index.applied_offset() + 1

    def fold(self, records: Iterable[Record], folded: Folded | None = None) -> Folded:
        out = Folded() if folded is None else folded
        for record in records:
            if record.offset < self.next_offset:
                continue
            self._fold_one(record, out)
            out.last_offset = record.offset
            self.next_offset = record.offset + 1
        return out

    def prepare(self, folded: Folded) -> PreparedWrite | None:
        """The index writes of ``folded`` (None when it folded nothing), for a changelog."""
        if folded.last_offset is None:
            return None
        return self.index.prepare(folded.batch, folded.last_offset, FOLD_VERSION)

    def commit(self, folded: Folded, prepared: PreparedWrite | None = None) -> None:
        """Write the batch and its last offset in one WriteBatch (after outputs are durable).

        ``prepared`` is ``prepare(folded)`` when the caller already made it.
        """
        if folded.last_offset is not None:
            if prepared is None:
                self.index.write(folded.batch, folded.last_offset, FOLD_VERSION)
            else:
                self.index.apply(prepared)
            for state in folded.batch.jobs.values():
                self._remember(state)
            self._paused_apply(folded.batch.controls.values())
            self.limits.update((s.name, s) for s in folded.batch.limits.values())
            for job_id in folded.batch.before_jobs.keys() - folded.batch.jobs.keys():
                self._cache.pop(job_id, None)  # purged
        if self.on_commit is not None and folded.observed:
            self.on_commit(folded.observed)

    def job(self, job_id: str, folded: Folded | None = None) -> JobState | None:
        if folded is not None and job_id in folded.batch.jobs:
            return folded.batch.jobs[job_id]
        if folded is not None and job_id in folded.batch.before_jobs:
            return None  # purged earlier in this batch
        cached = self._cache.get(job_id)
        if cached is not None:
            return cached
        state = self.index.job(job_id)
        if state is not None:
            self._remember(state)
        return state

    def _remember(self, state: JobState) -> None:
        """Keep ``state`` as the newest entry, dropping the oldest one past the bound."""
        cache = self._cache
        cache.pop(state.job_id, None)
        cache[state.job_id] = state
        if len(cache) > self._cache_size:
            del cache[next(iter(cache))]

    def paused(self, target: str, folded: Folded | None = None) -> Set[str]:
        """The paused queues or schedules (``target``): the index's, as ``folded`` left them."""
        committed = self._paused[target]
        batch = () if folded is None else folded.batch.controls.values()
        changed = [c for c in batch if c.target == target]
        if not changed:
            return committed
        paused = set(committed)
        for control in changed:
            (paused.add if control.paused else paused.discard)(control.name)
        return paused

    def _paused_apply(self, controls: Iterable[ControlState]) -> None:
        for control in controls:
            paused = self._paused[control.target]
            (paused.add if control.paused else paused.discard)(control.name)

    def schedule(self, schedule_id: str, folded: Folded | None = None) -> ScheduleState | None:
        if folded is not None and schedule_id in folded.batch.schedules:
            return folded.batch.schedules[schedule_id]
        return self.index.schedule(schedule_id)

    def _fold_one(self, record: Record, out: Folded) -> None:
        raw = record.value or b""
        try:
            event = avro.decode_event(raw)
        except DecodeError as exc:
            position = Position(
                partition=record.partition, offset=record.offset, log_at=record.log_at
            )
            entry = _undecodable(position, exc.reason)
            out.batch.undecodable.append((entry, raw))
            out.verdicts.append(("undecodable", Verdict.UNDECODABLE))
            self._judged(out, FoldedEvent(entry))
            return
        required = self.proofs.required
        position = self.proofs.position(
            partition=record.partition,
            offset=record.offset,
            log_at=record.log_at,
            event=event,
            value=raw,
            proof=proof_of(record.headers) if record.headers else None,
        )
        if position.proofs_required and not required:  # from this record on (core.roles)
            out.batch.tallies[PROOFS_REQUIRED] = 1
        out.seen_event_ids.add(event.event_id)
        match event.family:
            case EventFamily.JOB:
                self._fold_job(event, position, out, raw)
            case EventFamily.SCHEDULE:
                self._fold_schedule(event, position, out, raw)
            case EventFamily.CONTROL:
                self._fold_control(event, position, out, raw)
            case EventFamily.LIMIT:
                self._fold_limit(event, position, out, raw)
            case EventFamily.PERMIT:
                self._fold_permit(event, position, out, raw)
            case _:
                assert_never(event.family)

    def _fold_job(self, event: JobEvent, position: Position, out: Folded, raw: bytes) -> None:
        before = self.job(event.job_id, out)
        after, entry = fold_job(before, event, position, self.paused(QUEUE, out))
        if (self.limits or out.batch.limits) and before is not None:
            after, entry = self._guard(event, before, after, entry, out)
        out.verdicts.append((entry.kind, entry.verdict))
        out.batch.timeline.append((event.job_id, entry, raw))
        self._judged(out, FoldedEvent(entry, before, after))
        out.resolutions += workflows.resolutions_to_send(
            before, after, event, entry.verdict, pos=position, source=self.source
        )
        if entry.verdict is Verdict.APPLIED and after is None and before is not None:
            self._purged(before, position, out)
        elif before is None and after is None:
            # Rejected, of a job the index does not hold: its entry expires (fold version 6).
            _expires(out, event.job_id, entry)
        if entry.verdict is not Verdict.APPLIED or after is None:
            return
        ended = retention.ended_run(before, after, position.offset, position.log_at)
        if ended is not None:  # a new run of the id: the earlier ones leave on a mark
            out.batch.runs.append(RunStart(event.job_id, position.offset, ended))
        if event.job_id not in out.batch.before_jobs:
            out.batch.before_jobs[event.job_id] = before
        out.batch.jobs[event.job_id] = after
        self._count(before, after)
        _note_lease(out, after)
        if isinstance(event, AttemptSucceeded):
            out.effects.extend(
                AcceptedEffect(job_id=event.job_id, token=event.token, index=i, effect=effect)
                for i, effect in enumerate(event.effects)
            )

    def _judged(self, out: Folded, folded: FoldedEvent) -> None:
        """Count ``folded`` in the batch's tallies, and keep it for the commit hook."""
        for name in tallied(folded):
            out.batch.tallies[name] = out.batch.tallies.get(name, 0) + 1
        if self.on_commit is not None:
            out.observed.append(folded)

    def _purged(self, before: JobState, position: Position, out: Folded) -> None:
        """Record an applied purge: from here on the batch holds nothing for the job."""
        job_id, batch = before.job_id, out.batch
        purge = Purge(
            job_id=job_id,
            offset=position.offset,
            log_at=position.log_at,
            stored=batch.before_jobs.get(job_id, before),
            mark_until=retention.mark_until(before, position.log_at),
            generation=before.generation,
        )
        batch.purges.append(purge)
        batch.before_jobs[job_id] = None
        batch.jobs.pop(job_id, None)
        out.lease_ends.pop(job_id, None)

    def _fold_schedule(
        self, event: ScheduleEvent, position: Position, out: Folded, raw: bytes
    ) -> None:
        before = self.schedule(event.schedule_id, out)
        paused = event.schedule_id in self.paused(SCHEDULE, out)
        after, entry = fold_schedule_guarded(before, event, position, paused=paused)
        out.verdicts.append((entry.kind, entry.verdict))
        out.batch.timeline.append((event.schedule_id, entry, raw))
        self._judged(out, FoldedEvent(entry))
        if before is None and after is None:  # rejected, of an unknown schedule (fold version 7)
            _expires(out, event.schedule_id, entry)
        if entry.verdict is Verdict.APPLIED and after is not None:
            out.batch.before_schedules.setdefault(event.schedule_id, before)
            out.batch.schedules[event.schedule_id] = after

    def control(self, target: str, name: str, folded: Folded | None = None) -> ControlState | None:
        key = control_key(target, name)
        if folded is not None and key in folded.batch.controls:
            return folded.batch.controls[key]
        return self.index.control(target, name)

    def _fold_control(
        self, event: ControlEvent, position: Position, out: Folded, raw: bytes
    ) -> None:
        target, name = target_of(event)
        before = self.control(target, name, out)
        schedule = self.schedule(name, out) if target == SCHEDULE else None
        after, entry = fold_control(before, event, position, exists=target_exists(target, schedule))
        out.verdicts.append((entry.kind, entry.verdict))
        out.batch.timeline.append((name, entry, raw))
        self._judged(out, FoldedEvent(entry))
        if target == SCHEDULE and schedule is None:  # rejected: unknown schedule (fold version 7)
            _expires(out, name, entry)
        if entry.verdict is Verdict.APPLIED and after is not None:
            out.batch.controls[control_key(target, name)] = after

    def _guard(
        self,
        event: JobEvent,
        before: JobState,
        after: JobState | None,
        entry: TimelineEntry,
        out: Folded,
    ) -> tuple[JobState | None, TimelineEntry]:
        """The job fold under each of its limits this partition knows (core.permits)."""
        for name in limit_names(before):
            limit = self.limit(name, out)
            if limit is None:
                continue
            after, entry, new, forward = guard_job(limit, before, after, event, entry)
            if new is not limit:
                self._keep_limit(new, out)
            if forward is not None:
                out.forwards.append(forward)
        return after, entry

    def limit(self, name: str, folded: Folded | None = None) -> LimitState | None:
        """The limit state ``name`` as the index holds it, as ``folded`` left it."""
        if folded is not None and limit_key(name) in folded.batch.limits:
            return folded.batch.limits[limit_key(name)]
        return self.limits.get(name)

    def limits_as(self, folded: Folded | None = None) -> Mapping[str, LimitState]:
        """The limit states by name: the index's, as ``folded`` left them."""
        changed = () if folded is None else folded.batch.limits.values()
        if not changed:
            return self.limits
        return {**self.limits, **{state.name: state for state in changed}}

    def _keep_limit(self, state: LimitState, out: Folded) -> None:
        out.batch.limits[limit_key(state.name)] = state

    def _fold_limit(self, event: LimitEvent, position: Position, out: Folded, raw: bytes) -> None:
        name = limit_name(event)
        after, entry, forward = fold_limit(self.limit(name, out), event, position)
        self._limit_folded(name, after=after, entry=entry, forward=forward, out=out, raw=raw)
        if isinstance(event, QueuePermit):  # every permit step expires (fold version 7)
            _expires(out, name, entry)

    def _fold_permit(self, event: PermitEvent, position: Position, out: Folded, raw: bytes) -> None:
        job = self.job(event.job_id, out)
        state = self.limit(limit_name(event), out)
        after, entry, forward = fold_permit(state, job, event, position)
        self._limit_folded(
            event.job_id, after=after, entry=entry, forward=forward, out=out, raw=raw, job=job
        )
        if job is None:  # rejected: unknown job; its entry expires
            _expires(out, event.job_id, entry)

    def _limit_folded(
        self,
        entity: str,
        *,
        after: LimitState | None,
        entry: TimelineEntry,
        forward: Event | None,
        out: Folded,
        raw: bytes,
        job: JobState | None = None,
    ) -> None:
        out.verdicts.append((entry.kind, entry.verdict))
        out.batch.timeline.append((entity, entry, raw))
        # A permit's job is unchanged by it; metrics read when its grant came.
        self._judged(out, FoldedEvent(entry, job, job))
        if entry.verdict is Verdict.APPLIED and after is not None:
            self._keep_limit(after, out)
        if forward is not None:
            out.forwards.append(forward)

    def _seed_counts(self) -> None:
        """Count live leases once, from the lease index (every active job has an entry there)."""
        for job_id in self.index.expired_lease_ids(_LAST_MS, _NO_LIMIT):
            state = self.index.job(job_id)
            if state is not None:
                self._count(None, state)

    def _count(self, before: JobState | None, after: JobState) -> None:
        for counts, statuses in ((self.in_flight, ACTIVE_STATUSES), (self.unstarted, _LEASED)):
            was = before is not None and before.status in statuses
            now = after.status in statuses
            if was != now:
                counts[after.queue] = counts.get(after.queue, 0) + (1 if now else -1)
        if before is not None and before.status is Status.LEASED and after.status is Status.RUNNING:
            self.started[after.queue] = self.started.get(after.queue, 0) + 1


_LEASED = frozenset({Status.LEASED})
_LAST_MS = 2**63 - 1
_NO_LIMIT = 2**63 - 1


def _note_lease(out: Folded, state: JobState) -> None:
    """Keep ``out.lease_ends`` in step with the job's newest state in the batch."""
    if state.status in ACTIVE_STATUSES and state.lease_until is not None:
        out.lease_ends[state.job_id] = state.lease_until
    else:
        out.lease_ends.pop(state.job_id, None)


def _expires(out: Folded, entity_id: str, entry: TimelineEntry) -> None:
    """``entry`` leaves the index on a mark (index_orphans); an unkeyable id's is in ``refused``."""
    if keyable(entity_id):
        family = timeline_family(entry.kind)
        out.batch.orphans.append(Orphan(entity_id, entry.offset, entry.log_at, family))


def _undecodable(position: Position, reason: str) -> TimelineEntry:
    return TimelineEntry(
        partition=position.partition,
        offset=position.offset,
        log_at=position.log_at,
        kind="undecodable",
        event_id="",
        source="",
        verdict=Verdict.UNDECODABLE,
        reason=reason,
    )
