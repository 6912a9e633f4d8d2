"""Jobs waiting for a worker, and queues that have a backlog but no worker, from the fold.

A lease that expires before any start costs no attempt (the fold sends the job back to
``scheduled``): the job is waiting for a worker, not failing. This follower of a process's
commits counts such jobs per queue until one of their attempts starts (or they end), and the
unstarted expiries per queue since the queue's last start. A queue whose last ``threshold``
expiries were all unstarted while jobs wait has, as far as the log tells, no live worker: the
alert-worthy ``evsched_queue_without_worker`` gauge. Counts restart empty with the process and
fill again within one dispatch timeout (every waiting job's lease expires again by then).

A node leases no job of a queue it sees no worker of (``runtime.partition.presence``), so there
such a queue has no expiries to count: the node tells the queues it holds jobs of
(``watch_held``), and the gauge is 1 for those as well.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence, Set

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
        self._waiting: dict[str, tuple[str, int]] = {}  # job id -> (queue, partition)
        self._streak: Counter[str] = Counter()  # queue -> unstarted expiries since a start
        self.threshold = threshold
        self._held: Callable[[], Set[str]] = frozenset  # queues a node holds jobs of, no worker
        self._once_held: set[str] = set()
        if registry is not None:
            registry.register(self)

    def watch_held(self, held: Callable[[], Set[str]]) -> None:
        """Read at scrape time: queues whose due jobs a node holds back for want of a worker."""
        self._held = held

    def observe(self, events: Sequence[FoldedEvent]) -> None:
        with self._lock:
            for folded in events:
                self._one(folded)

    def forget(self, partitions: Collection[int]) -> None:
        """Partitions this process no longer folds (revoked): their jobs' news goes elsewhere."""
        with self._lock:
            for job, (_, partition) in list(self._waiting.items()):
                if partition in partitions:
                    del self._waiting[job]

    def _one(self, folded: FoldedEvent) -> None:
        entry, before, after = folded.entry, folded.before, folded.after
        if entry.verdict is not Verdict.APPLIED or after is None:
            return
        job, queue = after.job_id, after.queue
        if entry.kind == "LeaseExpired" and before is not None and before.status is Status.LEASED:
            self._waiting[job] = (queue, entry.partition)
            self._streak[queue] += 1
        elif entry.kind == "AttemptStarted":
            self._waiting.pop(job, None)
            self._streak[queue] = 0
        elif after.status in TERMINAL_STATUSES:
            self._waiting.pop(job, None)

    def _queues(self) -> dict[str, tuple[int, int, bool]]:
        """Per queue seen to wait at some point: (jobs waiting, streak, without a worker)."""
        with self._lock:
            counts = Counter(queue for queue, _ in self._waiting.values())
            streaks = dict(self._streak)
        held = self._held()
        self._once_held |= held  # kept at 0 once they have a worker, as the streaks are
        return {
            queue: (
                counts[queue],
                streaks.get(queue, 0),
                queue in held or (counts[queue] > 0 and streaks.get(queue, 0) >= self.threshold),
            )
            for queue in sorted(streaks.keys() | self._once_held)
        }

    def waiting(self) -> dict[str, int]:
        """Jobs waiting for a worker per queue (queues seen to wait at some point, zeros kept)."""
        return {queue: count for queue, (count, _, _) in self._queues().items()}

    def without_worker(self) -> dict[str, bool]:
        return {queue: none for queue, (_, _, none) in self._queues().items()}

    def collect(self) -> Iterator[Metric]:
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
            "1 while jobs of the queue wait and its last leases all expired unstarted, or a node "
            "holds its due jobs because no worker serves it.",
            labels=["queue"],
        )
        for queue, (count, expiries, workerless) in self._queues().items():
            family.add_metric([queue], count)
            streak.add_metric([queue], expiries)
            none.add_metric([queue], 1 if workerless else 0)
        yield from (family, streak, none)
