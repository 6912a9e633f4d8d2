"""One owned events partition: fold its records, decide, and commit outputs with offsets atomically.

Each step folds new records into an index batch, plans leases, expiries, cron fires and purges
on top of it, then sends effects, decisions and dispatch records in one transaction of its outbox.
Effects always travel with the consumer offset of the records they came from; other steps commit
the offset every ``OFFSET_COMMIT_INTERVAL_MS``. The index changes go to the state changelog once
per flush interval, in that step's transaction (``runtime.projection.changelog``). Only after the
transaction commits is the index written, so the index never holds a decision or an effect the log
does not; it may hold changes its changelog does not have yet (the events log has them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence, Set
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import structlog

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.index.writes import PreparedWrite
from evsched.adapters.kafka.topics import Topics
from evsched.adapters.proofs import NodeKeyring
from evsched.adapters.signing import DispatchKey
from evsched.core import planner, retention
from evsched.core.controls import QUEUE, SCHEDULE
from evsched.core.events import (
    Event,
    JobEnqueued,
    JobEvent,
    JobPurged,
    LeaseExpired,
    Position,
    Role,
    entity_id,
)
from evsched.core.proposals import fire_refusal, job_refusal
from evsched.core.roles import proof_role
from evsched.core.state import JobState, ScheduleState, Status
from evsched.ports import Clock, ConsumerOffset, Outgoing, PartitionOutbox, Record
from evsched.runtime.partition.budget import QueueBudget, QueueLoad
from evsched.runtime.partition.lease_plan import (
    LeanLeases,
    Planned,
    Staffing,
    leases_against,
    waiting_by_queue,
)
from evsched.runtime.partition.pending import Pending
from evsched.runtime.partition.permit_plan import PermitPlanner
from evsched.runtime.partition.quarantine import EnsureQueues, Quarantine, hold_unusable
from evsched.runtime.partition.refusals import Refusals
from evsched.runtime.projection.changelog import ChangelogWriter
from evsched.runtime.projection.fold_chunks import fold_chunked, refold_chunked
from evsched.runtime.projection.projector import AcceptedEffect, CommitHook, Folded, Projector

if TYPE_CHECKING:
    from evsched.metrics import PartitionInstruments
    from evsched.runtime.partition.presence import WorkerPresence

log = structlog.get_logger("evsched.node")

# A decision not seen back in the log within this time (e.g. its transaction aborted) is retried.
PENDING_TIMEOUT_S = 15.0

# Records whose fold sends nothing (a lease, an attempt start, most successes) need no transaction
# of their own: their consumer offset rides on the partition's next transaction, or goes out alone
# once it has waited this long.
OFFSET_COMMIT_INTERVAL_MS = 500


class OwnedPartition:
    """The node's work for one partition it owns; ``step`` is called by the node's poll loop."""

    def __init__(
        self,
        *,
        index: PartitionIndex,
        topics: Topics,
        outbox: PartitionOutbox,
        clock: Clock,
        group_id: str,
        node_id: str,
        budgets: planner.PlannerBudgets,
        committed: int | None,
        end_offset: int,
        ensure_queues: EnsureQueues,
        scan_limit: int = 1_000,
        on_commit: CommitHook | None = None,
        instruments: PartitionInstruments | None = None,
        dispatch_key: DispatchKey | None = None,
        budget: QueueBudget | None = None,
        changelog: ChangelogWriter | None = None,
        keyring: NodeKeyring | None = None,
        presence: WorkerPresence | None = None,
        offset_fences: bool = False,
    ) -> None:
        partition = index.partition
        # Every transaction carries the consumer offset (one transaction per node tick: it is the
        # fence); otherwise only those with effects, and every OFFSET_COMMIT_INTERVAL_MS.
        self.offset_fences = offset_fences
        self.presence = presence  # None: every queue counts as served
        self.changelog = changelog  # None: this partition's index changes go to no changelog
        self.dispatch_key = dispatch_key
        # The node keys: this node's facts carry its proof, its dispatches their lease's key.
        self.keyring = keyring
        self.partition = partition
        self.topics = topics
        self.outbox = outbox
        self.clock = clock
        self.group_id = group_id
        self.source = f"node-{node_id}"
        self.budgets = budgets
        self.ensure_queues = ensure_queues
        self.scan_limit = scan_limit
        self.index = index
        self.projector = Projector(
            self.index, on_commit=on_commit, source=self.source, keyring=keyring
        )
        self.instruments = instruments
        # Records below the committed offset were folded and their outputs sent before a crash.
        self.replay_until = committed if committed is not None else 0
        # Decide nothing until the log as it stood at assignment is folded: a previous owner's
        # decisions must be seen before proposing new ones.
        self.end_offset = end_offset
        self.caught_up = False
        self.pending = Pending(clock)
        self.permits = PermitPlanner(self.projector, self.pending, self.source)
        self.lean = LeanLeases(
            index,
            self.projector,
            budgets=budgets,
            scan_limit=scan_limit,
            held_back=self._held_back,
            permits=self.permits,
            source=self.source,
        )
        self.wake_at: int | None = None
        # The consumer offset the group holds for this partition, and when records past it were
        # first folded without a transaction of their own (epoch ms).
        self.committed_to = self.replay_until
        self.uncommitted_since: int | None = None
        self.stats: Counter[str] = Counter()
        self.log = log.bind(partition=partition)
        self.quarantine = Quarantine(partition, clock, instruments)
        # Decisions the fold refused or would refuse, held back until their job's state changes.
        self.refusals = Refusals(partition, self.quarantine)
        # The node's per-queue budgets are shared by all its partitions (None: this one alone).
        self.budget = budget
        self.woken = False  # another partition made room since the last step
        self.on_wake: Callable[[], None] | None = None  # the runner's kick
        if budget is not None:
            budget.join(partition, self)

    def wake(self) -> None:
        self.woken = True
        if self.on_wake is not None:
            self.on_wake()

    def _held(self) -> int:
        load = self.load()
        return sum(load.in_flight.values()) + sum(load.unstarted.values())

    def load(self) -> QueueLoad:
        """This partition's jobs against the per-queue budgets, its pending leases included."""
        in_flight = dict(self.projector.in_flight)
        unstarted = dict(self.projector.unstarted)
        for queue, count in self.pending.leases_by_queue.items():
            in_flight[queue] = in_flight.get(queue, 0) + count
            unstarted[queue] = unstarted.get(queue, 0) + count
        return QueueLoad(in_flight=in_flight, unstarted=unstarted)

    @property
    def resume_offset(self) -> int:
        return self.index.applied_offset() + 1

    def next_wake_at(self) -> int | None:
        """When this partition next has something to decide without new records arriving."""
        return self.wake_at

    def has_work(self, records: Sequence[Record], now: int) -> bool:
        """Whether a step would do anything: records to fold, catching up, or a wake time due.

        Without records nothing changes what ``_plan`` sees before ``wake_at`` (due times, lease
        ends, cron slots and pending deadlines are all in it), so such a step is skipped.
        """
        return (
            bool(records)
            or not self.caught_up
            or self.woken
            or (self.wake_at is not None and now >= self.wake_at)
        )

    async def step(self, records: Sequence[Record], now: int, position: int) -> int:
        """Fold ``records`` and act on them; returns how many decisions were sent.

        ``position`` is the consumer's next fetch offset, past any transaction markers.
        """
        self.woken = False
        held = self._held() if self.budget is not None else 0
        gap = [r for r in records if r.offset < self.replay_until]
        fresh = [r for r in records if r.offset >= self.replay_until]
        # Folded in chunks: a catch-up's thousands of records must not hold the event loop.
        if gap:
            await refold_chunked(self.projector, gap, applied=self._note)
            self.log.info("gap_refolded", count=len(gap), until=self.replay_until)
        started = dict(self.projector.started) if self.budget is not None else {}
        folded = await fold_chunked(self.projector, fresh)
        if self.budget is not None and self.projector.started != started:
            # The starts this step folded size the node's unstarted limits.
            grown = {q: n - started.get(q, 0) for q, n in self.projector.started.items()}
            self.budget.rate.add(grown, self.clock.monotonic_s())
        if fresh:
            self.log.debug(
                "records_folded", first=fresh[0].offset, last=fresh[-1].offset, count=len(fresh)
            )
        self.refusals.observe(folded.batch.timeline, self.pending.by_event)
        self.pending.settle(folded.seen_event_ids, self.clock.monotonic_s())
        # Folded completions and starts free room that other partitions may be waiting for.
        freed = self.budget is not None and self._held() < held
        self.caught_up = self.caught_up or position >= self.end_offset
        decisions = self._plan(folded, now) if self.caught_up else []
        outgoing = [_effect_record(self.topics, e) for e in folded.effects]
        # Resolutions (keyed by the child) and permit steps (keyed by a limit's home or a job)
        # go to their own partitions; like effects, sent once with the records' offset.
        outgoing += [self._event(r, own_partition=False) for r in folded.resolutions]
        outgoing += [self._event(e, own_partition=False) for e in folded.forwards] + decisions
        # The keys changed since the last flush go to the changelog, their newest values read
        # from the index as it stands before this step's batch, with its meta record, once per
        # interval (one transaction is made for them if nothing else goes).
        prepared = self.projector.prepare(folded)
        changelog = self._changelog_due(now)
        offset = self.projector.next_offset
        if offset > self.committed_to and self.uncommitted_since is None:
            self.uncommitted_since = now
        # Effects go out with the offset of the records they came from, in one transaction: that
        # is what makes them exactly once. Leases, expiries and fires are derived from state, not
        # from records (after a crash the new owner folds them back before deciding anything),
        # so their transactions need no offset; offsets alone go out every so often. Under one
        # transaction per node tick every transaction carries it: with the group's generation it
        # is what fences a zombie (``adapters.kafka.node_transactions``).
        forwarded = folded.effects or folded.resolutions or folded.forwards
        sending = bool(outgoing or changelog)
        fence = self.offset_fences and sending
        with_offset = bool(forwarded) or self._offset_due(now) or fence
        self._count(steps=1, records=len(records))
        if sending or with_offset:
            ours = ConsumerOffset(self.topics.events, self.partition, offset, self.group_id)
            sent = await self._send(outgoing, ours if with_offset else None, changelog)
            self._flushed(changelog)
            self._count(transactions=1, effects=len(folded.effects))
            decisions = [o for o in sent if o.decision is not None]
        for entity in self.quarantine.take_fresh():
            self.pending.forget(entity)
        if with_offset:
            self.committed_to = offset
            self.uncommitted_since = None
        # Written after the transaction only: the index may run ahead of the group's offset by
        # records that sent nothing (refolding them sends nothing either), never by an effect.
        self.projector.commit(folded, prepared)
        self._note(prepared)
        self._count(decisions=len(decisions))
        if self.budget is not None and freed:
            self.budget.freed(self.partition)
        # A lease this step folded that is already over: its expiry is planned from the index,
        # which holds it from this step's commit on, so the next step comes at once
        # (``next_due_at`` looks only past ``now``).
        saturated = len(decisions) >= self.scan_limit or folded.lease_ended(now)
        self.wake_at = self._next_wake(now, saturated=saturated)
        return len(decisions)

    async def _send(
        self, outgoing: list[Outgoing], offset: ConsumerOffset | None, changelog: list[Outgoing]
    ) -> list[Outgoing]:
        """One transaction, without the decisions held back (on an unusable queue, or refused)."""
        records = await hold_unusable(outgoing, self.quarantine, self.ensure_queues)
        return await self.outbox.send(records + changelog, offset=offset, holdback=self.quarantine)

    def _note(self, prepared: PreparedWrite | None) -> None:
        """A batch was written to the index: its keys go to the changelog's next flush."""
        if self.changelog is not None and prepared is not None:
            self.changelog.note(prepared, self.clock.now_ms())

    def _changelog_due(self, now: int) -> list[Outgoing]:
        """The changelog's flush when one is due: for this step's transaction."""
        if self.changelog is None or not self.changelog.due(now):
            return []
        return self.changelog.flush(self.index)

    def _flushed(self, changelog: list[Outgoing]) -> None:
        """The transaction that carried ``changelog`` (a flush, or nothing) committed."""
        if changelog and self.changelog is not None:
            self.changelog.flushed()
            self.stats.update(changelog_records=len(changelog))

    async def flush_changelog(self) -> int:
        """Send what the changelog has not yet (the partition is being closed); records sent."""
        if self.changelog is None or not (records := self.changelog.flush(self.index)):
            return 0
        await self.outbox.send(records, offset=None, holdback=self.quarantine)
        self._flushed(records)
        self._count(transactions=1)
        return len(records)

    def _count(self, **counts: int) -> None:
        self.stats.update(counts)
        if self.instruments is not None:
            for name, value in counts.items():
                getattr(self.instruments, name).inc(value)

    def _offset_due(self, now: int) -> bool:
        since = self.uncommitted_since
        return since is not None and now - since >= OFFSET_COMMIT_INTERVAL_MS

    def _next_wake(self, now: int, *, saturated: bool) -> int | None:
        """Blocked due work (pending, queue full) waits for records; the rest for its time."""
        if saturated:
            return now
        flush = None
        if self.uncommitted_since is not None:
            flush = self.uncommitted_since + OFFSET_COMMIT_INTERVAL_MS
        times = [
            t
            for t in (
                self.index.next_due_at(after=now, due_lead_ms=self.budgets.prelease_ms),
                self.pending.first_deadline_ms(now),
                self.quarantine.first_release_ms(now),
                flush,
                None if self.changelog is None else self.changelog.deadline(),
                *self.permits.wakes(now),
            )
            if t is not None
        ]
        return min(times) if times else None

    def _plan(self, folded: Folded, now: int) -> list[Outgoing]:
        deadline = self.clock.monotonic_s() + PENDING_TIMEOUT_S
        # Where a decision would land, as closely as known: the next offset, the node's clock.
        at = Position(partition=self.partition, offset=self.projector.next_offset, log_at=now)
        out: list[Outgoing] = []
        for lease in self._plan_leases(folded, now):
            job_id = lease.event.job_id
            if not self._fits(job_id, lease.state, lease.event, at):
                continue
            if records := self._encode(job_id, self._lease_records, lease):
                out += records
                self.pending.add(lease.event.event_id, job_id, lease.dispatch.queue, deadline)
        expiring = self._jobs(self.index.expired_lease_ids(now, self.scan_limit), folded)
        expiries = planner.plan_expiries(expiring, now=now, source=self.source)
        out += self._decide(expiring, expiries, at, deadline)
        out += self._permit_records(now, deadline, folded)
        schedules = {s.schedule_id: s for s in self._due_schedules(folded, now)}
        for fired, enqueued in planner.plan_fires(
            [*schedules.values()], now=now, source=self.source
        ):
            sid = fired.schedule_id
            if not self.refusals.vet(sid, "ScheduleFired", fire_refusal(schedules[sid], fired, at)):
                continue
            both = (fired,) if enqueued is None else (fired, enqueued)  # a missed slot: no job
            if records := self._encode(sid, self._events, *both):
                out += records
                self.pending.add(fired.event_id, sid, None, deadline)
        ended = self._ended(folded, now)
        purges = planner.plan_purges(ended, now=now, source=self.source)
        return out + self._decide(ended, purges, at, deadline)

    def _decide(
        self,
        states: list[JobState],
        events: Sequence[LeaseExpired | JobPurged],
        at: Position,
        deadline: float,
    ) -> list[Outgoing]:
        """The records of the expiries or purges the dry run lets through, each made pending."""
        planned_from = {s.job_id: s for s in states} if events else {}
        out: list[Outgoing] = []
        for event in events:
            job_id = event.job_id
            if not self._fits(job_id, planned_from[job_id], event, at):
                continue
            if records := self._encode(job_id, self._events, event):
                out += records
                self.pending.add(event.event_id, job_id, None, deadline)
        return out

    def _fits(self, job_id: str, state: JobState, event: JobEvent, at: Position) -> bool:
        """Whether the fold would apply ``event`` to the state it was planned from; if not, it is
        not sent and the job is held back (``runtime.partition.refusals``)."""
        return self.refusals.vet(job_id, type(event).__name__, job_refusal(state, event, at))

    def _permit_records(self, now: int, deadline: float, folded: Folded) -> list[Outgoing]:
        """Permit requests made while planning leases, and this partition's homes' grants."""
        out: list[Outgoing] = []
        for entity, step in self.permits.take(now, folded):
            if records := self._encode(entity, self._events, step):
                out += records
                self.pending.add(step.event_id, entity, None, deadline)
        return out

    def _lease_records(self, lease: planner.Lease) -> list[Outgoing]:
        # The dispatch record goes first: if it is refused, its lease is never sent either.
        return [self._dispatch(lease), self._event(lease.event)]

    def _events(self, *events: Event) -> list[Outgoing]:
        """Decision events: on this partition, except a cron fire's job (keyed by its own id)."""
        return [self._event(e, own_partition=not isinstance(e, JobEnqueued)) for e in events]

    def _encode(
        self, entity: str, build: Callable[..., list[Outgoing]], *args: Any
    ) -> list[Outgoing]:
        """One decision's records, tagged with ``entity``; none (quarantined) if they can't be made.

        Nothing a record holds may stop the partition: whatever the fold let through that cannot
        be encoded or named as a topic is this decision's failure only.
        """
        try:
            return [replace(o, decision=entity) for o in build(*args)]
        except Exception as exc:
            self.quarantine.add(entity, "encode", repr(exc))
            return []

    def _plan_leases(self, folded: Folded, now: int) -> list[planner.Lease]:
        load = self._lease_load()
        presence = self.presence
        staffing = Staffing(None if presence is None else presence.staffed())
        # Only the jobs leased are decoded, unless an entry cannot stand for its state.
        planned = self.lean.plan(folded, now, load, staffing)
        leases, candidates, unread = planned or self._plan_read_all(folded, now, load, staffing)
        if presence is not None:
            presence.held(self.partition, staffing.held)
        if self.budget is not None:
            self.budget.waited(
                self.partition,
                blocked=waiting_by_queue(leases, candidates, unread),
                leased={lease.dispatch.queue for lease in leases},
            )
        return leases

    def _lease_load(self) -> QueueLoad:
        """What the leases of this step count against: the node's queues, or this partition's."""
        if self.budget is None:
            return self.load()
        load = self.budget.total()
        # The due jobs of the partitions ahead in a queue's line take its room first.
        reserved = self.budget.ahead(self.partition)
        in_flight = Counter(load.in_flight) + Counter(reserved)
        unstarted = Counter(load.unstarted) + Counter(reserved)
        raised = self.budget.rate.limits(
            self.budgets.max_unstarted_per_queue,
            self.budgets.max_in_flight_per_queue,
            self.budgets.unstarted_horizon_ms / 1000,
            self.clock.monotonic_s(),
        )
        return QueueLoad(dict(in_flight), dict(unstarted), raised)

    def _plan_read_all(
        self, folded: Folded, now: int, load: QueueLoad, staffing: Staffing | None = None
    ) -> Planned:
        """Leases from every due job's state in the scan's window (``LeanLeases`` reads fewer)."""
        staffing = staffing or Staffing(None)
        # Held-back jobs (pending, or on an undeclared queue) must not fill the scan's window.
        horizon = now + self.budgets.prelease_ms
        paused = self.projector.paused(QUEUE, folded)

        def skip(job_id: str) -> bool:
            return self._lease_skip(job_id, paused, folded, staffing)

        # In lease order (priority first), so a backlog deeper than the scan cannot hide a job.
        ids = self.index.due_by_priority(horizon, self.scan_limit, skip=skip)
        ids += [j for j, s in folded.batch.jobs.items() if s.status is Status.SCHEDULED]
        candidates = [
            s
            for s in self._jobs(ids, folded)
            if s.run_at <= horizon and s.queue not in paused and not staffing.holds(s.queue)
        ]
        if self.permits.active(folded):
            candidates = self.permits.permitted(candidates, now, folded)
        leases = leases_against(
            load,
            candidates,
            now=now,
            budgets=self.budgets,
            source=self.source,
            events_offset=self.projector.next_offset,
            staffed=staffing.staffed,
        )
        return leases, list(candidates), {}

    def _ended(self, folded: Folded, now: int) -> list[JobState]:
        """Finished jobs that may be due for a purge: the index's, and those that just ended."""
        ids = self.index.due_purge_ids(now, self.scan_limit)
        ids += [j for j, s in folded.batch.jobs.items() if retention.purge_at(s) is not None]
        return self._jobs(ids, folded)

    def _held_back(self, entity: str) -> bool:
        return entity in self.pending.entities or self.quarantine.holds(entity)

    def _lease_skip(
        self, job_id: str, paused: Set[str], folded: Folded, staffing: Staffing
    ) -> bool:
        """Held back, on a paused queue or one no worker serves: such due jobs must not fill the
        scan's window."""
        if self._held_back(job_id):
            return True
        active = self.permits.active(folded)
        if not paused and not active and staffing.staffed is None:
            return False
        state = self.projector.job(job_id)
        if state is None:
            return False
        # A job that asked for a permit waits for its grant, not for the scan.
        return (
            state.queue in paused
            or staffing.holds(state.queue)
            or (active and self.permits.waits(state, folded))
        )

    def _jobs(self, ids: Sequence[str], folded: Folded) -> list[JobState]:
        found: dict[str, JobState] = {}
        for job_id in ids:
            if job_id in found or self._held_back(job_id):
                continue
            state = self.projector.job(job_id, folded)
            if state is not None:
                found[job_id] = state
        return list(found.values())

    def _due_schedules(self, folded: Folded, now: int) -> list[ScheduleState]:
        paused = self.projector.paused(SCHEDULE, folded)

        def skip(schedule_id: str) -> bool:
            return self._held_back(schedule_id) or schedule_id in paused

        ids = self.index.due_schedule_ids(now, self.scan_limit, skip=skip)
        ids += list(folded.batch.schedules)
        found: dict[str, ScheduleState] = {}
        for sid in ids:
            state = self.projector.schedule(sid, folded)
            if not skip(sid) and state is not None:
                found[sid] = state
        return list(found.values())

    def _event(self, event: Event, *, own_partition: bool = True) -> Outgoing:
        value = avro.encode_event(event)
        keyring = self.keyring
        proven = keyring is not None and proof_role(event) is Role.NODE
        return Outgoing(
            topic=self.topics.events,
            key=entity_id(event).encode(),
            value=value,
            partition=self.partition if own_partition else None,
            headers=(keyring.header(value),) if proven and keyring is not None else (),
        )

    def _dispatch(self, lease: planner.Lease) -> Outgoing:
        dispatch = lease.dispatch
        topic = self.topics.dispatch(dispatch.queue)
        if self.keyring is not None:
            lease_key = self.keyring.lease_key(dispatch.job_id, dispatch.token)
            dispatch = replace(dispatch, lease_key=lease_key)
        value = avro.encode_dispatch(dispatch)
        key = self.dispatch_key  # workers holding the key run only what a node signed
        return Outgoing(
            topic=topic,
            key=dispatch.job_id.encode(),
            value=value,
            headers=() if key is None else (key.header(topic, value),),
            queue=dispatch.queue,
        )

    def close(self) -> None:
        self.leave()
        self.index.close()

    def leave(self) -> None:
        """Leave the node's budget; a node closes the index itself, off the event loop."""
        if self.budget is not None:
            self.budget.leave(self.partition, self)


def _effect_record(topics: Topics, accepted: AcceptedEffect) -> Outgoing:
    headers: list[tuple[str, bytes]] = [
        ("evsched-job-id", accepted.job_id.encode()),
        ("evsched-token", str(accepted.token).encode()),
        ("evsched-effect-index", str(accepted.index).encode()),
        ("evsched-effect-kind", accepted.effect.kind.encode()),
    ]
    if accepted.effect.key is not None:
        headers.append(("evsched-effect-key", accepted.effect.key.encode()))
    return Outgoing(
        topic=topics.effects,
        key=accepted.job_id.encode(),
        value=accepted.effect.payload,
        headers=tuple(headers),
    )
