"""A seeded generator of realistic multi-partition event logs, for the audit and rebuild benchmarks.

It simulates a busy deployment on a millisecond clock: jobs arrive at a steady rate and each
follows a fate drawn at random (most succeed at once; others retry with the real backoff, die,
lose their worker and are expired and re-leased while the old worker's late completion comes in
stale, never start, are cancelled while scheduled or running, save checkpoints, or are enqueued
again with the same or a different body). Producer retries repeat an event's bytes now and then.
Every event is a plausible next step, so the fold's verdicts match the intent: applied for the
most part, duplicate, conflict, stale and rejected where a real log has them.

Events come out in log order per partition, with their log time; the same seed gives the same
log, and a caller can keep one partition's events only (``partition=``) without encoding the rest.

With ``retention_ms`` the jobs are enqueued with that retention (as a client stamps its
namespace's ``EVSCHED_RETENTION_MS``) and the log holds the purges a node writes as log time
passes each finished job's retention (``bench/history_purges.py``); without it (the default) the
log is what it always was, and no job is ever purged.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Container, Iterator
from dataclasses import dataclass
from typing import Any

from evsched.adapters.avro import encode_event
from evsched.adapters.kafka.partition_log import partition_for
from evsched.core import ids
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Effect,
    Event,
    JobCancelled,
    JobEnqueued,
    JobLeased,
    JobPurged,
    LeaseExpired,
    LeaseRenewed,
    RetryPolicy,
)
from evsched.core.retry import backoff_ms
from history_purges import Purger

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
POLICY = RetryPolicy(initial_backoff_ms=1_000, max_backoff_ms=60_000, multiplier=2.0, jitter=0.1)
DISPATCH_MS = 5_000
RUN_LEASE_MS = 2_000
HEARTBEAT_MS = 800
_V4_MASK = ~((0xF << 76) | (0x3 << 62)) & ((1 << 128) - 1)
_V4_BITS = (0x4 << 76) | (0x2 << 62)
FATES = (
    ("ok", 76),
    ("retry", 8),
    ("dead", 2),
    ("permanent", 2),
    ("expired", 3),
    ("never_started", 1),
    ("cancel_scheduled", 2),
    ("cancel_running", 1),
    ("checkpoints", 2),
    ("duplicate_enqueue", 2),
    ("conflict", 1),
)


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """One record of the generated log."""

    partition: int
    log_at: int
    key: bytes
    value: bytes


@dataclass(eq=False)
class _Job:
    job_id: str
    partition: int
    fate: str
    enqueue: JobEnqueued
    token: int = 0
    attempt: int = 0
    step: str = "lease"
    ends_at: int = 0


class Generator:
    """Yields the records of ``jobs`` jobs spread over ``partitions`` partitions, in log order."""

    def __init__(
        self,
        *,
        jobs: int,
        partitions: int,
        seed: int = 1,
        gap_ms: int = 1,
        retention_ms: int | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.jobs = jobs
        self.partitions = partitions
        self.gap_ms = gap_ms
        self.retention_ms = retention_ms
        # Draws no random numbers: a log with purges has the same jobs and fates as one without.
        self.purger = None if retention_ms is None else Purger()
        self._heap: list[tuple[int, int, _Job]] = []
        self._seq = 0
        self._fates = [name for name, weight in FATES for _ in range(weight)]

    def uid(self) -> str:
        """A random version-4 UUID string (cheaper than building uuid.UUID objects)."""
        h = f"{self.rng.getrandbits(128) & _V4_MASK | _V4_BITS:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def events(self) -> Iterator[tuple[int, int, Event]]:
        """(partition, log time, event) in log time order across partitions; with a retention,
        each purge comes when it is due, before the jobs' events of that moment.

        The log ends with the last job's last event: purges due later are not written.
        """
        if self.purger is None:
            yield from self._simulated()
            return
        for p, at, event in self._simulated():
            yield from self.purger.due(at)
            self.purger.fold(p, at, event)
            yield p, at, event

    def _simulated(self) -> Iterator[tuple[int, int, Event]]:
        started = 0
        next_arrival = T0
        while started < self.jobs or self._heap:
            if started < self.jobs and (not self._heap or next_arrival <= self._heap[0][0]):
                job = self._new_job(next_arrival)
                started += 1
                next_arrival += self.gap_ms
                yield job.partition, next_arrival - self.gap_ms, job.enqueue
                continue
            at, _, job = heapq.heappop(self._heap)
            for event in self._advance(job, at):
                yield job.partition, at, event

    def records(self, partitions: Container[int] | None = None) -> Iterator[LoggedRecord]:
        """Encoded records, optionally of some partitions only; every 101st is sent twice."""
        for count, (p, at, event) in enumerate(self.events()):
            if partitions is not None and p not in partitions:
                continue
            value = encode_event(event)
            key = _key(event)
            yield LoggedRecord(p, at, key, value)
            # A producer retry: the same bytes again. Never of a purge: the node sends those
            # with its idempotent, transactional producer, which does not repeat a record.
            if count % 101 == 0 and not isinstance(event, JobPurged):
                yield LoggedRecord(p, at, key, value)

    # --- the simulation --------------------------------------------------------------------------

    def _meta(self, job: _Job, at: int, source: str) -> dict[str, Any]:
        return {"event_id": self.uid(), "job_id": job.job_id, "emitted_at": at, "source": source}

    def _schedule(self, job: _Job, at: int, step: str) -> None:
        job.step = step
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, job))

    def _new_job(self, at: int) -> _Job:
        fate = self.rng.choice(self._fates)
        job_id = self.uid()
        key = f"order-{job_id[:8]}" if fate in ("duplicate_enqueue", "conflict") else None
        if key is not None:
            job_id = ids.job_id_for_key("default", key)
        args = f'{{"args":["{job_id[:8]}"],"kwargs":{{}}}}'.encode()
        run_at = at + 60_000 if fate == "cancel_scheduled" else None
        enqueue = JobEnqueued(
            event_id=self.uid(),
            job_id=job_id,
            emitted_at=at,
            source="client",
            task="billing.send_receipt",
            queue="default",
            args=args,
            run_at=run_at,
            max_attempts=3,
            retry=POLICY,
            idempotency_key=key,
            body_digest=ids.body_digest("billing.send_receipt", "default", args) if key else None,
            retention_ms=self.retention_ms,
        )
        job = _Job(job_id, partition_for(job_id, self.partitions), fate, enqueue)
        self._first_step(job, at)
        return job

    def _first_step(self, job: _Job, at: int) -> None:
        if job.fate == "cancel_scheduled":
            self._schedule(job, at + self.rng.randint(100, 5_000), "cancel")
        elif job.fate in ("duplicate_enqueue", "conflict"):
            self._schedule(job, at + self.rng.randint(1, 50), "again")
        else:
            self._schedule(job, at + self.rng.randint(1, 5), "lease")

    def _advance(self, job: _Job, at: int) -> list[Event]:
        step = getattr(self, f"_{job.step}")
        events: list[Event] = step(job, at)
        return events

    def _again(self, job: _Job, at: int) -> list[Event]:
        e = job.enqueue
        args = e.args if job.fate == "duplicate_enqueue" else b'{"args":["other"],"kwargs":{}}'
        again = JobEnqueued(
            **self._meta(job, at, "api"),
            task=e.task,
            queue=e.queue,
            args=args,
            idempotency_key=e.idempotency_key,
            body_digest=ids.body_digest(e.task, e.queue, args),
            retry=POLICY,
            retention_ms=self.retention_ms,
        )
        self._schedule(job, at + self.rng.randint(1, 5), "lease")
        return [again]

    def _cancel(self, job: _Job, at: int) -> list[Event]:
        return [JobCancelled(**self._meta(job, at, "client"), reason="not needed")]

    def _lease(self, job: _Job, at: int) -> list[Event]:
        job.token += 1
        job.attempt += 1
        lease = JobLeased(
            **self._meta(job, at, "node-1"),
            token=job.token,
            attempt=job.attempt,
            lease_ms=DISPATCH_MS,
        )
        if job.fate == "never_started" and job.attempt == 1:
            self._schedule(job, at + DISPATCH_MS + self.rng.randint(1, 20), "expire")
        else:
            self._schedule(job, at + self.rng.randint(2, 30), "start")
        return [lease]

    def _start(self, job: _Job, at: int) -> list[Event]:
        worker = f"worker-{self.rng.randint(1, 8)}"
        started = AttemptStarted(
            **self._meta(job, at, worker),
            token=job.token,
            worker_id=worker,
            lease_ms=RUN_LEASE_MS,
        )
        job.ends_at = at + self.rng.randint(20, 2_500)
        if job.fate == "expired" and job.attempt == 1:
            self._schedule(job, at + RUN_LEASE_MS + self.rng.randint(1, 20), "expire")
        elif job.fate == "cancel_running":
            self._schedule(job, at + self.rng.randint(5, 15), "cancel_then_finish")
        else:
            self._schedule(job, min(job.ends_at, at + HEARTBEAT_MS), "heartbeat")
        return [started]

    def _heartbeat(self, job: _Job, at: int) -> list[Event]:
        if at >= job.ends_at:
            return self._finish(job, at)
        if job.fate == "checkpoints":
            saved = AttemptCheckpointed(
                **self._meta(job, at, "worker"),
                token=job.token,
                checkpoint=str(at - T0).encode(),
            )
            self._schedule(job, min(job.ends_at, at + HEARTBEAT_MS), "heartbeat")
            return [saved]
        renewed = LeaseRenewed(
            **self._meta(job, at, "worker"),
            token=job.token,
            lease_ms=RUN_LEASE_MS,
        )
        self._schedule(job, min(job.ends_at, at + HEARTBEAT_MS), "heartbeat")
        return [renewed]

    def _finish(self, job: _Job, at: int) -> list[Event]:
        fails = (job.fate == "retry" and job.attempt == 1) or job.fate in ("dead", "permanent")
        if not fails:
            return [self._success(job, at, job.token)]
        permanent = job.fate == "permanent"
        failed = AttemptFailed(
            **self._meta(job, at, "worker"),
            token=job.token,
            error_type="ValueError" if permanent else "ConnectionError",
            message="bad input" if permanent else f"attempt {job.attempt}: connection reset",
            retryable=not permanent,
        )
        if not permanent and job.attempt < job.enqueue.max_attempts:
            delay = backoff_ms(POLICY, job.job_id, job.attempt)
            self._schedule(job, at + delay + self.rng.randint(1, 20), "lease")
        return [failed]

    def _success(self, job: _Job, at: int, token: int) -> AttemptSucceeded:
        return AttemptSucceeded(
            **self._meta(job, at, "worker"),
            token=token,
            result=b'{"sent":true}',
            effects=(Effect(kind="email.send", payload=b'{"to":"a@example.com"}', key=job.job_id),),
        )

    def _expire(self, job: _Job, at: int) -> list[Event]:
        expired = LeaseExpired(**self._meta(job, at, "node-1"), token=job.token)
        delay = backoff_ms(POLICY, job.job_id, job.attempt)
        if job.fate == "expired":
            # The frozen worker wakes up after the re-lease and reports its success: stale.
            self._zombie(job, at + delay + 200)
        self._schedule(job, at + delay + self.rng.randint(1, 20), "lease")
        return [expired]

    def _zombie(self, job: _Job, at: int) -> None:
        ghost = _Job(job.job_id, job.partition, "zombie", job.enqueue, token=job.token)
        self._schedule(ghost, at, "late_success")

    def _late_success(self, job: _Job, at: int) -> list[Event]:
        return [self._success(job, at, job.token)]

    def _cancel_then_finish(self, job: _Job, at: int) -> list[Event]:
        # The running attempt's completion arrives after the cancel: rejected.
        ghost = _Job(job.job_id, job.partition, "zombie", job.enqueue, token=job.token)
        self._schedule(ghost, at + self.rng.randint(50, 500), "late_success")
        return [JobCancelled(**self._meta(job, at, "client"), reason="operator")]


def _key(event: Event) -> bytes:
    return event.job_id.encode()
