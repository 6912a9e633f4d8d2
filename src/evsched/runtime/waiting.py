"""Jobs waiting for a worker, and queues that have a backlog but no worker, from the fold.

A lease that expires before any start costs no attempt (the fold sends the job back to
``scheduled``): the job is waiting for a worker, not failing. This follower of a process's
commits counts such jobs per queue until one of their attempts starts (or they end), and the
unstarted expiries per queue since the queue's last start. A queue whose last ``threshold``
expiries were all unstarted while jobs wait has, as far as the log tells, no live worker: the
alert-worthy ``evsched_queue_without_worker`` gauge. Counts restart empty with the process and
fill again within one dispatch timeout (every waiting job's lease expires again by then).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from evsched.core.state import TERMINAL_STATUSES, FoldedEvent, Status, Verdict

# Unstarted expiries in a row (no start in between) after which a queue counts as workerless.
WITHOUT_WORKER_AFTER = 2


class WaitingForWorker:
    """``observe`` is a commit hook follower; the gauges are read at scrape time."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, threshold: int = WITHOUT_WORKER_AFTER
    ) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, str] = {}  # job id -> queue
        self._streak: Counter[str] = Counter()  # queue -> unstarted expiries since a start
        self.threshold = threshold
        if registry is not None:
            registry.register(self)

    def observe(self, events: Sequence[FoldedEvent]) -> None:
        with self._lock:
            for folded in events:
                self._one(folded)

    def _one(self, folded: FoldedEvent) -> None:
        entry, before, after = folded.entry, folded.before, folded.after
        if entry.verdict is not Verdict.APPLIED or after is None:
            return
        job, queue = after.job_id, after.queue
        if entry.kind == "LeaseExpired" and before is not None and before.status is Status.LEASED:
            self._waiting[job] = queue
            self._streak[queue] += 1
        elif entry.kind == "AttemptStarted":
            self._waiting.pop(job, None)
            self._streak[queue] = 0
        elif after.status in TERMINAL_STATUSES:
            self._waiting.pop(job, None)

    def waiting(self) -> dict[str, int]:
        """Jobs waiting for a worker per queue (queues seen to wait at some point, zeros kept)."""
        with self._lock:
            counts = Counter(self._waiting.values())
            return {queue: counts.get(queue, 0) for queue in sorted(self._streak)}

    def without_worker(self) -> dict[str, bool]:
        waiting = self.waiting()
        with self._lock:
            return {q: waiting[q] > 0 and self._streak[q] >= self.threshold for q in waiting}

    def collect(self) -> Iterator[Metric]:
        waiting = self.waiting()
        with self._lock:
            streaks = dict(self._streak)
        family = GaugeMetricFamily(
            "evsched_jobs_waiting_for_worker",
            "Jobs whose last lease expired before any worker started it, not started since.",
            labels=["queue"],
        )
        streak = GaugeMetricFamily(
            "evsched_queue_unstarted_expiries",
            "Leases of the queue that expired unstarted since the queue's last attempt start.",
            labels=["queue"],
        )
        none = GaugeMetricFamily(
            "evsched_queue_without_worker",
            "1 while jobs of the queue wait and its last leases all expired unstarted.",
            labels=["queue"],
        )
        for queue, count in waiting.items():
            family.add_metric([queue], count)
            streak.add_metric([queue], streaks.get(queue, 0))
            workerless = count > 0 and streaks.get(queue, 0) >= self.threshold
            none.add_metric([queue], 1 if workerless else 0)
        yield from (family, streak, none)
