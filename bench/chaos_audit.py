"""The chaos soak's auditor: an independent model of the job lifecycle, checked against the topics.

It never calls the fold: it reads the events topic in log order and keeps its own account of
each job (status, token, attempt, lease deadline) by the lifecycle table of
docs/job-lifecycle.md, so a defect in the fold shows as a disagreement with the nodes. Its one
simplification: a lease before ``run_at`` counts as granted (it does not recompute backoff).

Reported (``Findings``): acknowledged enqueues never terminal (lost); effects carrying two
tokens (duplicate accepted successes); effects published twice, from a token the model did not
accept (stale), or missing; dead jobs never started; expiries of leases never started (since
fold version 2 they spend no attempt, the model's too, so a node that spent one shows in
``refused_leases``); starts past their deadline (``leased_at + lease_ms``) or after the job
ended; undecodable records against the garbage injected; per fault, its stall (``stalls``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Event,
    JobCancelled,
    JobEnqueued,
    JobLeased,
    JobRequeued,
    LeaseExpired,
    LeaseRenewed,
    ScheduleFired,
)

SCHEDULED, LEASED, RUNNING = "scheduled", "leased", "running"
SUCCEEDED, DEAD, CANCELLED = "succeeded", "dead", "cancelled"
TERMINAL = frozenset({SUCCEEDED, DEAD, CANCELLED})
EffectId = tuple[str, int, int]  # job id, token, effect index


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of the events topic; ``event`` is None when its bytes did not decode."""

    partition: int
    offset: int
    log_at: int
    event: Event | None


@dataclass(frozen=True, slots=True)
class Fault:
    """A kill: a node's (with the events partitions it owned) or a worker's.

    ``worker_id`` is what the killed worker's ids start with (its host and pid).
    """

    kind: str  # "node" or "worker"
    at_ms: int
    partitions: frozenset[int] = frozenset()
    worker_id: str = ""


@dataclass(slots=True)
class _Attempt:
    leased_at: int
    started_at: int | None = None
    worker_id: str = ""
    ended_at: int | None = None

    def in_flight(self, at: int, worker_prefix: str) -> bool:
        """Leased and not started at ``at``, or running then on a worker named ``worker_prefix``."""
        if self.leased_at > at or (self.ended_at is not None and self.ended_at < at):
            return False
        if self.started_at is None or self.started_at > at:
            return True
        return self.worker_id.startswith(worker_prefix)


@dataclass(slots=True)
class _Job:
    partition: int
    enqueued_at: int
    max_attempts: int
    status: str = SCHEDULED
    token: int = 0
    attempt: int = 0
    lease_until: int | None = None
    done_at: int | None = None
    event_ids: set[str] = field(default_factory=set)
    deadlines: dict[int, int] = field(default_factory=dict)  # token -> start deadline
    attempts: dict[int, _Attempt] = field(default_factory=dict)  # token -> applied lease
    starts: list[int] = field(default_factory=list)  # log times of applied starts


@dataclass(slots=True)
class Findings:
    """What the audit found; ``figures`` is the flat ``key=value`` view of it."""

    acknowledged: int = 0
    lost: list[str] = field(default_factory=list)
    succeeded: int = 0
    dead: int = 0
    cancelled: int = 0
    duplicate_successes: list[str] = field(default_factory=list)
    duplicate_effects: list[EffectId] = field(default_factory=list)
    stale_effects: list[EffectId] = field(default_factory=list)
    missing_effects: list[EffectId] = field(default_factory=list)
    dead_unstarted: list[str] = field(default_factory=list)
    unstarted_expiries: int = 0
    refused_leases: int = 0
    late_starts: int = 0
    late_start_max_ms: int = 0
    starts_after_terminal: int = 0
    undecodable: int = 0
    injected_garbage: int = 0
    stalls: dict[str, list[float]] = field(default_factory=dict)

    def figures(self) -> dict[str, object]:
        out: dict[str, object] = {
            "acknowledged": self.acknowledged,
            "lost": len(self.lost),
            "succeeded": self.succeeded,
            "dead": self.dead,
            "cancelled": self.cancelled,
            "dup_successes": len(self.duplicate_successes),
            "dup_effects": len(self.duplicate_effects),
            "stale_effects": len(self.stale_effects),
            "missing_effects": len(self.missing_effects),
            "dead_unstarted": len(self.dead_unstarted),
            "unstarted_expiries": self.unstarted_expiries,
            "refused_leases": self.refused_leases,
            "late_starts": self.late_starts,
            "late_start_max_ms": self.late_start_max_ms,
            "starts_after_terminal": self.starts_after_terminal,
            "undecodable": self.undecodable,
            "injected_garbage": self.injected_garbage,
        }
        for kind, values in sorted(self.stalls.items()):
            out[f"{kind}_stalls_measured"] = len(values)
            out[f"{kind}_stall_p50_s"] = round(_median(values), 2) if values else "nan"
            out[f"{kind}_stall_max_s"] = round(max(values), 2) if values else "nan"
        return out


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


@dataclass(slots=True)
class Auditor:
    """Feed it the events topic in log order per partition, then the effects; ask ``findings``.

    ``injected`` holds the job ids the hostile producer forged: their events are not audited
    (they are hostile by construction), but they still count in the log's undecodable total.
    """

    acknowledged: set[str]
    injected: set[str] = field(default_factory=set)
    injected_garbage: int = 0
    jobs: dict[str, _Job] = field(default_factory=dict)
    leases_by_partition: dict[int, list[int]] = field(default_factory=dict)
    late_starts: int = 0
    late_start_max_ms: int = 0
    starts_after_terminal: int = 0
    unstarted_expiries: int = 0
    refused_leases: int = 0
    undecodable: int = 0
    accepted: dict[tuple[str, int], int] = field(default_factory=dict)  # (job, token) -> effects
    published: Counter[EffectId] = field(default_factory=Counter)

    def feed_all(self, records: Iterable[LogRecord]) -> Auditor:
        for record in records:
            self.feed(record)
        return self

    def feed(self, record: LogRecord) -> None:
        event = record.event
        if event is None:
            self.undecodable += 1
            return
        job_id = getattr(event, "job_id", None)
        if (
            not isinstance(job_id, str)
            or job_id in self.injected
            or isinstance(event, ScheduleFired)
        ):
            return
        job = self.jobs.get(job_id)
        if job is None:
            if isinstance(event, JobEnqueued):
                self.jobs[job_id] = _Job(
                    partition=record.partition,
                    enqueued_at=record.log_at,
                    max_attempts=max(1, event.max_attempts),
                    event_ids={event.event_id},
                )
            return
        if event.event_id in job.event_ids:
            return  # a producer retry: applied once
        job.event_ids.add(event.event_id)
        self._step(job_id, job, event, record)

    def is_terminal(self, job_id: str) -> bool:
        job = self.jobs.get(job_id)
        return job is not None and job.status in TERMINAL

    def done_after(self, job_ids: Iterable[str]) -> list[int]:
        """Enqueue-to-success milliseconds (log times) of those of ``job_ids`` that succeeded."""
        jobs = [self.jobs.get(j) for j in job_ids]
        return [
            j.done_at - j.enqueued_at
            for j in jobs
            if j is not None and j.status == SUCCEEDED and j.done_at is not None
        ]

    def effects(self, ids: Iterable[EffectId]) -> Auditor:
        """Count the published effects, but those of forged jobs (their runs are not audited)."""
        self.published.update(e for e in ids if e[0] not in self.injected)
        return self

    def _step(self, job_id: str, job: _Job, event: Event, record: LogRecord) -> None:
        at = record.log_at
        match event:
            case JobCancelled() if job.status not in TERMINAL:
                self._end(job, CANCELLED, at)
            case JobRequeued() if job.status in (DEAD, CANCELLED):
                job.status, job.attempt, job.lease_until, job.done_at = SCHEDULED, 0, None, None
            case JobLeased():
                self._leased(job, event, record)
            case AttemptStarted():
                self._started(job, event, at)
            case LeaseRenewed() | AttemptCheckpointed() | AttemptSucceeded() | AttemptFailed():
                if job.status == RUNNING and event.token == job.token:
                    self._running(job_id, job, event, at)
            case LeaseExpired() if self._live(job, event.token):
                if job.lease_until is not None and at < job.lease_until:
                    pass  # not expired yet by the log's clock: not applied
                elif job.status == LEASED:
                    self._unstarted_expiry(job, at)
                else:
                    self._retry_or_die(job, retryable=True, at=at)
            case _:
                pass

    @staticmethod
    def _live(job: _Job, token: int) -> bool:
        return token == job.token and job.status in (LEASED, RUNNING)

    def _leased(self, job: _Job, event: JobLeased, record: LogRecord) -> None:
        if job.status != SCHEDULED or event.token <= job.token:
            self.refused_leases += 1
            return
        if event.attempt != job.attempt + 1:
            self.refused_leases += 1  # e.g. a node that spent an attempt on an unstarted expiry
            return
        job.status, job.token, job.attempt = LEASED, event.token, event.attempt
        job.lease_until = record.log_at + event.lease_ms
        job.deadlines[event.token] = job.lease_until
        job.attempts[event.token] = _Attempt(record.log_at)
        self.leases_by_partition.setdefault(record.partition, []).append(record.log_at)

    def _started(self, job: _Job, event: AttemptStarted, at: int) -> None:
        # Counted whatever the model makes of it. A start logged at or past its lease's start
        # deadline is not applied, as the fold does not (docs/job-lifecycle.md): its worker runs
        # no handler for it (its `start_after_deadline` line), and the expiry that follows
        # spends no attempt.
        deadline = job.deadlines.get(event.token)
        late = deadline is not None and at >= deadline
        if late and deadline is not None:
            self.late_starts += 1
            self.late_start_max_ms = max(self.late_start_max_ms, at - deadline)
        self.starts_after_terminal += job.status in TERMINAL
        if job.status == LEASED and event.token == job.token and not late:
            job.status, job.lease_until = RUNNING, at + event.lease_ms
            job.starts.append(at)
            attempt = job.attempts[event.token]
            attempt.started_at, attempt.worker_id = at, event.worker_id

    def _running(
        self,
        job_id: str,
        job: _Job,
        event: LeaseRenewed | AttemptCheckpointed | AttemptSucceeded | AttemptFailed,
        at: int,
    ) -> None:
        if isinstance(event, LeaseRenewed):
            job.lease_until = at + event.lease_ms
        elif isinstance(event, AttemptSucceeded):
            self.accepted[(job_id, event.token)] = len(event.effects)
            self._end(job, SUCCEEDED, at)
        elif isinstance(event, AttemptFailed):
            self._retry_or_die(job, retryable=event.retryable, at=at)

    def _unstarted_expiry(self, job: _Job, at: int) -> None:
        # Lifecycle since fold version 2: no attempt spent, due again at once, no error.
        self.unstarted_expiries += 1
        self._close_attempt(job, at)
        job.status, job.attempt, job.lease_until = SCHEDULED, job.attempt - 1, None

    def _retry_or_die(self, job: _Job, *, retryable: bool, at: int) -> None:
        if retryable and job.attempt < job.max_attempts:
            self._close_attempt(job, at)
            job.status, job.lease_until = SCHEDULED, None
        else:
            self._end(job, DEAD, at)

    def _end(self, job: _Job, status: str, at: int) -> None:
        self._close_attempt(job, at)
        job.status, job.lease_until, job.done_at = status, None, at

    @staticmethod
    def _close_attempt(job: _Job, at: int) -> None:
        attempt = job.attempts.get(job.token)
        if attempt is not None and attempt.ended_at is None:
            attempt.ended_at = at

    def findings(self, faults: Iterable[Fault] = ()) -> Findings:
        found = Findings(
            acknowledged=len(self.acknowledged),
            unstarted_expiries=self.unstarted_expiries,
            refused_leases=self.refused_leases,
            late_starts=self.late_starts,
            late_start_max_ms=self.late_start_max_ms,
            starts_after_terminal=self.starts_after_terminal,
            undecodable=self.undecodable,
            injected_garbage=self.injected_garbage,
        )
        for job_id in sorted(self.acknowledged):
            job = self.jobs.get(job_id)
            if job is None or job.status not in TERMINAL:
                found.lost.append(job_id)
        for job_id, job in sorted(self.jobs.items()):
            found.succeeded += job.status == SUCCEEDED
            found.dead += job.status == DEAD
            found.cancelled += job.status == CANCELLED
            if job.status == DEAD and not job.starts:
                found.dead_unstarted.append(job_id)
        self._audit_effects(found)
        found.stalls = self.stalls(faults)
        return found

    def _audit_effects(self, found: Findings) -> None:
        tokens: dict[str, set[int]] = {}
        for effect, count in sorted(self.published.items()):
            job_id, token, _ = effect
            tokens.setdefault(job_id, set()).add(token)
            if count > 1:
                found.duplicate_effects.append(effect)
            if (job_id, token) not in self.accepted:
                found.stale_effects.append(effect)
        found.duplicate_successes = sorted(j for j, seen in tokens.items() if len(seen) > 1)
        found.missing_effects = [
            (job_id, token, i)
            for (job_id, token), count in sorted(self.accepted.items())
            for i in range(count)
            if (job_id, token, i) not in self.published
        ]

    def stalls(self, faults: Iterable[Fault]) -> dict[str, list[float]]:
        """Seconds each fault held up work; a fault that held up nothing is left out.

        A node kill: per partition it owned, the time from the kill to the partition's next
        lease (its scheduler is back), the largest over those partitions. A worker kill: per
        job in flight at the kill (leased and not yet started anywhere, or running on the killed
        worker), the time from the kill to the job's next start (or to its death, when it never
        started again), the largest over those jobs.
        """
        out: dict[str, list[float]] = {"node": [], "node_gap": [], "worker": []}
        for fault in faults:
            stall = self.stall(fault)
            if stall is not None:
                out.setdefault(fault.kind, []).append(stall)
            if fault.kind == "node" and (gap := self.node_gap(fault)) is not None:
                out["node_gap"].append(gap)
        return out

    def node_gap(self, fault: Fault) -> float | None:
        """Seconds without a decision on a killed node's partitions: per partition it owned,
        from its last lease before the kill to its first after, the largest (issue 9, F.19);
        None when no partition had a lease on both sides."""
        gaps = []
        for partition in fault.partitions:
            leases = self.leases_by_partition.get(partition, [])
            before = [t for t in leases if t < fault.at_ms]
            after = [t for t in leases if t >= fault.at_ms]
            if before and after:
                gaps.append(min(after) - max(before))
        return max(gaps) / 1000 if gaps else None

    def stall(self, fault: Fault) -> float | None:
        """Seconds ``fault`` held up work (see ``stalls``), or None when it held up nothing."""
        waits = self._node_waits(fault) if fault.kind == "node" else self._worker_waits(fault)
        return max(waits) / 1000 if waits else None

    def _node_waits(self, fault: Fault) -> list[int]:
        waits = []
        for partition in fault.partitions:
            later = [t for t in self.leases_by_partition.get(partition, []) if t >= fault.at_ms]
            if later:
                waits.append(min(later) - fault.at_ms)
        return waits

    def _worker_waits(self, fault: Fault) -> list[int]:
        waits = []
        at = fault.at_ms
        for job in self.jobs.values():
            if not any(a.in_flight(at, fault.worker_id) for a in job.attempts.values()):
                continue
            later = [t for t in job.starts if t >= at]
            if not later and job.status == DEAD and job.done_at is not None:
                later = [job.done_at]
            if later:
                waits.append(min(later) - at)
        return waits
