"""Prometheus metrics of what a process folds and serves, counted from the fold's own verdicts.

A ``Metrics`` holds its own registry (several in one process never collide). Its
``observe_commit`` is the commit hook of a Replica or Projector, so verdicts, lease expirations,
stale completions, start lateness and the jobs-by-status gauge cost no second fold.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client import Counter as PromCounter
from prometheus_client.core import GaugeMetricFamily, Metric

from evsched.adapters.index.store import PartitionIndex
from evsched.core import tallies
from evsched.core.failures import BUILTIN_CATEGORIES, category_of
from evsched.core.state import TERMINAL_STATUSES, FoldedEvent, JobState, Status, Verdict

log = structlog.get_logger("evsched.metrics")

ENQUEUE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENESS_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Events that end an attempt with an error (a lease expiry of a started attempt records one).
FAILURES = frozenset({"AttemptFailed", "LeaseExpired"})
MAX_APP_CATEGORIES = 20
OTHER_CATEGORY = "other"


class JobCounts:
    """Jobs per (queue, status): seeded by one scan of the indexes, then moved by applied events.

    The scan and every commit run on the event loop without an await between an index write and
    its hook, so after ``seed`` the counts always equal a fresh scan of the indexes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, Status]] = Counter()
        self.seeded = False

    def seed(self, indexes: Iterable[PartitionIndex]) -> int:
        """Replace the counts by a scan of every job (decodes each one); returns how many."""
        fresh: Counter[tuple[str, Status]] = Counter(
            (state.queue, state.status) for index in indexes for state in index.jobs()
        )
        with self._lock:
            self._counts = fresh
            self.seeded = True
        return fresh.total()

    def move(self, before: JobState | None, after: JobState | None) -> None:
        """A job changed from ``before`` (None: new) to ``after`` (None: purged)."""
        if not self.seeded:
            return  # the seed will count this job as the index holds it
        with self._lock:
            if before is not None:
                self._counts[(before.queue, before.status)] -= 1
            if after is not None:
                self._counts[(after.queue, after.status)] += 1

    def snapshot(self) -> dict[tuple[str, Status], int]:
        with self._lock:
            return {key: n for key, n in self._counts.items() if n}

    def by_queue(self) -> dict[str, dict[Status, int]]:
        """Every status of every queue that has or had jobs, zeros included."""
        counts = self.snapshot()
        with self._lock:
            queues = sorted({queue for queue, _ in self._counts})
        return {q: {s: counts.get((q, s), 0) for s in Status} for q in queues}


class _JobsCollector:
    """``evsched_jobs{queue,status}``, read from the counts at scrape time."""

    def __init__(self, counts: JobCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "evsched_jobs", "Jobs by queue and status, as folded here.", labels=["queue", "status"]
        )
        for queue, statuses in self._counts.by_queue().items():
            for status, n in statuses.items():
                family.add_metric([queue, status.value], n)
        yield family


class Metrics:
    """The instruments of one process, on a registry of their own.

    ``job_counts`` adds the ``evsched_jobs`` gauge, for processes that fold every partition (the
    API's replica); a node folds only the partitions it owns, so it leaves the gauge out.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, job_counts: bool = True
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.jobs = JobCounts()
        # Other observers of the same commits (the dashboard's live counters), called after these.
        self.followers: list[Callable[[Sequence[FoldedEvent]], None]] = []
        r = self.registry
        self.events_folded = PromCounter(
            "evsched_events_folded",
            "Events folded, by kind and verdict.",
            ["kind", "verdict"],
            registry=r,
        )
        self.lease_expirations = PromCounter(
            "evsched_lease_expirations", "Applied LeaseExpired events.", ["queue"], registry=r
        )
        self.stale_completions = PromCounter(
            "evsched_stale_completions",
            "Completions (success or failure) judged stale: a zombie worker's late report.",
            ["queue", "kind"],
            registry=r,
        )
        self.start_lateness = Histogram(
            "evsched_start_lateness_seconds",
            "Log time of an applied AttemptStarted minus the job's run_at.",
            ["queue"],
            buckets=LATENESS_BUCKETS_S,
            registry=r,
        )
        self.start_lateness_by_cause = Histogram(
            "evsched_start_lateness_by_cause_seconds",
            "evsched_start_lateness_seconds split: time a job due waited for a permit of a "
            "concurrency or rate limit (cause limit) and the rest (cause late).",
            ["queue", "cause"],
            buckets=LATENESS_BUCKETS_S,
            registry=r,
        )
        # Log time of each applied PermitGranted whose job has neither started nor ended since
        # (bounded by the limits' holders): the start splits its lateness at it.
        self._granted_at: dict[str, int] = {}
        self.enqueue_latency = Histogram(
            "evsched_enqueue_latency_seconds",
            "API-side time to produce an enqueue and get the broker's acknowledgement.",
            buckets=ENQUEUE_BUCKETS_S,
            registry=r,
        )
        self.consumer_lag = Gauge(
            "evsched_consumer_lag_records",
            "Records between the replica's read position and the end of its events partition.",
            ["partition"],
            registry=r,
        )
        self.applied_offset = Gauge(
            "evsched_applied_offset",
            "Offset of the last record folded into the index of an events partition.",
            ["partition"],
            registry=r,
        )
        self.dead_letters = PromCounter(
            "evsched_dead_letters",
            "Jobs that went dead (out of attempts, a permanent failure, an expired last lease).",
            ["queue"],
            registry=r,
        )
        self.failures = PromCounter(
            "evsched_failures",
            "Attempts that failed or lost their worker, by queue and failure category: transient, "
            "permanent, timeout, cancelled, lost_worker, or an app's own (the first "
            f"{MAX_APP_CATEGORIES} seen; later ones count as 'other').",
            ["queue", "category"],
            registry=r,
        )
        self._categories = CategoryLabels()
        self.writes_unconfirmed = PromCounter(
            "evsched_api_writes_unconfirmed",
            "API writes answered 202 unconfirmed: the broker did not acknowledge them in time.",
            registry=r,
        )
        self.unknown_queue_refusals = PromCounter(
            "evsched_api_unknown_queue_refusals",
            "API writes refused because they named a queue that is not declared.",
            registry=r,
        )
        if job_counts:
            r.register(_JobsCollector(self.jobs))

    # --- the commit hook ------------------------------------------------------------------------

    def observe_commit(self, events: Sequence[FoldedEvent]) -> None:
        """Count one committed batch (``Replica(on_commit=metrics.observe_commit)``)."""
        for folded in events:
            entry, after = folded.entry, folded.after
            self.events_folded.labels(entry.kind, entry.verdict.value).inc()
            if (purged := folded.purged) is not None:
                self.jobs.move(purged, None)  # it left the index
            elif after is None:
                continue
            elif entry.verdict is Verdict.APPLIED:
                self.jobs.move(folded.before, after)
                self._applied(entry.kind, entry.log_at, after, folded.before)
                if tallies.DEAD_LETTERS in tallies.tallied(folded):
                    self.dead_letters.labels(after.queue).inc()
            elif tallies.STALE_COMPLETIONS in tallies.tallied(folded):
                self.stale_completions.labels(after.queue, entry.kind).inc()
        for follower in self.followers:
            follower(events)

    def _applied(
        self, kind: str, log_at: int, after: JobState, before: JobState | None = None
    ) -> None:
        error = after.last_error
        if (
            kind in FAILURES
            and error is not None
            and (before is None or before.last_error != error)
        ):
            label = self._categories.label(category_of(error))
            self.failures.labels(after.queue, label).inc()
        if kind == "LeaseExpired":
            self.lease_expirations.labels(after.queue).inc()
        elif kind == "AttemptStarted":
            # A start never applies before run_at (the lease is refused earlier), so this is >= 0.
            lateness_s = max(0, log_at - after.run_at) / 1000
            self.start_lateness.labels(after.queue).observe(lateness_s)
            self._split_lateness(after, log_at)
        elif kind == "PermitGranted":
            self._granted_at[after.job_id] = log_at
        elif after.status in TERMINAL_STATUSES:
            # Granted and never started (cancelled, or dead once its lease ran out): no start
            # will split a lateness at this grant, and a long-lived API must not keep it.
            self._granted_at.pop(after.job_id, None)

    def _split_lateness(self, after: JobState, log_at: int) -> None:
        """A start's lateness: waited for a permit (until its grant) and the rest."""
        granted = self._granted_at.pop(after.job_id, None)
        waited = 0 if granted is None else max(0, granted - after.run_at)
        total = max(0, log_at - after.run_at)
        waited = min(waited, total)
        if granted is not None:
            self.start_lateness_by_cause.labels(after.queue, "limit").observe(waited / 1000)
        self.start_lateness_by_cause.labels(after.queue, "late").observe((total - waited) / 1000)

    # --- values read at scrape time -------------------------------------------------------------

    def set_positions(self, applied: Mapping[int, int], lag: Mapping[int, int] | None) -> None:
        """Applied offsets per partition, and the lag when it could be read (else it is cleared)."""
        for partition, offset in applied.items():
            self.applied_offset.labels(str(partition)).set(offset)
        if lag is None:
            self.consumer_lag.clear()
            return
        for partition, records in lag.items():
            self.consumer_lag.labels(str(partition)).set(records)

    def render(self) -> tuple[bytes, str]:
        """The registry in Prometheus' text format, and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class CategoryLabels:
    """Failure categories as metric labels: the built-in ones, and at most
    ``MAX_APP_CATEGORIES`` of an app's own per process (the fold bounds their names; this bounds
    how many series they make)."""

    def __init__(self, limit: int = MAX_APP_CATEGORIES) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def label(self, category: str) -> str:
        if category in BUILTIN_CATEGORIES or category in self._seen:
            return category
        if len(self._seen) < self._limit:
            self._seen.add(category)
            return category
        return OTHER_CATEGORY


@dataclass(frozen=True, slots=True)
class PartitionInstruments:
    """One owned partition's counters, bound to its label once."""

    steps: Any
    records: Any
    transactions: Any
    decisions: Any
    effects: Any
    inbox: Any
    # Decisions held back (``quarantined(stage).inc()``): encode, topic, undeclared
    # (its queue has no dispatch topic yet; counted each time it is held again), send, fold
    # (the node's dry run of the fold refused it) or rejected (the fold did not apply it).
    quarantined: Any


class NodeInstruments:
    """What a node's partition runners do: steps, transactions, decisions, backlog."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

        def counter(name: str, doc: str) -> PromCounter:
            return PromCounter(name, doc, ["partition"], registry=registry)

        self.steps = counter(
            "evsched_node_steps", "Partition steps: fold, plan, maybe a transaction."
        )
        self.records = counter("evsched_node_records_folded", "Records folded by partition steps.")
        self.transactions = counter(
            "evsched_node_transactions", "Kafka transactions committed by partition steps."
        )
        self.decisions = counter(
            "evsched_node_decisions",
            "Records the scheduler sent: leases with their dispatch, expiries, cron fires.",
        )
        self.effects = counter(
            "evsched_node_effects_published", "Effects sent to the effects topic."
        )
        self.inbox = Gauge(
            "evsched_node_inbox_records",
            "Fetched records waiting for their partition's next step.",
            ["partition"],
            registry=registry,
        )
        self.owned = Gauge(
            "evsched_node_partitions_owned", "Events partitions this node owns.", registry=registry
        )
        self.dropped = PromCounter(
            "evsched_node_partitions_dropped",
            "Partitions dropped after a failed step, by reason: fenced (another node owns it "
            "now), transaction_lost (fenced while still the owner: reopened from its index) or "
            "error (reopened from its index).",
            ["reason"],
            registry=registry,
        )
        self.standby_lag = Gauge(
            "evsched_node_standby_lag_records",
            "Per standby partition (--standby): records between its warm index and the log's end.",
            ["partition"],
            registry=registry,
        )
        self.index_rebuilds = PromCounter(
            "evsched_node_index_rebuilds",
            "Partition indexes the node rebuilt from the log on open, by reason: fold_version "
            "(another fold version built the index).",
            ["reason"],
            registry=registry,
        )

        self.quarantined = PromCounter(
            "evsched_node_decisions_quarantined",
            "Decisions held back because they could not be encoded (encode), their queue is not "
            "declared (undeclared), their dispatch topic is misconfigured (topic), a record "
            "was refused (send), the fold would refuse them (fold: never sent) or did not apply "
            "them (rejected).",
            ["partition", "stage"],
            registry=registry,
        )
        self.failing = Gauge(
            "evsched_node_partition_failing",
            "1 while an assigned partition is not running: its last step or open failed.",
            ["partition"],
            registry=registry,
        )

    def watch_owned(self, owned: Callable[[], Iterable[int]]) -> None:
        """Read the owned partitions at scrape time: their count, and one series per partition."""
        self.owned.set_function(lambda: len(list(owned())))
        self._registry.register(_OwnedCollector(owned))

    def partition(self, partition: int) -> PartitionInstruments:
        label = str(partition)
        return PartitionInstruments(
            steps=self.steps.labels(label),
            records=self.records.labels(label),
            transactions=self.transactions.labels(label),
            decisions=self.decisions.labels(label),
            effects=self.effects.labels(label),
            inbox=self.inbox.labels(label),
            quarantined=lambda stage: self.quarantined.labels(label, stage),
        )


class _OwnedCollector:
    """``evsched_node_partition_owned{partition}``: so a dashboard and an alert see each owner."""

    def __init__(self, owned: Callable[[], Iterable[int]]) -> None:
        self._owned = owned

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "evsched_node_partition_owned",
            "1 for each events partition this node owns now (runs its fold and scheduler).",
            labels=["partition"],
        )
        for partition in sorted(self._owned()):
            family.add_metric([str(partition)], 1)
        yield family


ATTEMPT_BUCKETS_S = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


class WorkerInstruments:
    """What a worker's attempts did: outcomes and durations by task, and how many run now."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.registry = registry
        self.attempts = PromCounter(
            "evsched_worker_attempts",
            "Attempts this worker finished, by task and outcome: reported (a success sent; "
            "whether the fold accepted it or rejected it as stale shows only in a node's or the "
            "API's verdict metrics), failed (retryable), failed_permanent or snoozed.",
            ["task", "outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "evsched_worker_attempt_seconds",
            "From sending AttemptStarted to sending the attempt's completion.",
            ["task"],
            buckets=ATTEMPT_BUCKETS_S,
            registry=registry,
        )
        self.skipped = PromCounter(
            "evsched_worker_dispatches_skipped",
            "Dispatch records this worker took but did not start, by reason: expired (past its "
            "start deadline), superseded, duplicate, finished, not_due, undecodable, unsigned, "
            "forged.",
            ["reason"],
            registry=registry,
        )
        self.running = Gauge(
            "evsched_worker_running_attempts",
            "Attempts running on this worker now.",
            registry=registry,
        )
        self.queues = Gauge(
            "evsched_worker_queues",
            "1 for each queue this worker takes dispatch records from.",
            ["queue"],
            registry=registry,
        )

    def serving(self, queues: Iterable[str]) -> None:
        for queue in queues:
            self.queues.labels(queue).set(1)

    def finished(self, task: str, outcome: str, seconds: float) -> None:
        self.attempts.labels(task, outcome).inc()
        self.duration.labels(task).observe(seconds)

    def skipped_dispatch(self, reason: str) -> None:
        self.skipped.labels(reason).inc()


# From an outbox row's insert to the broker's acknowledgement of its event: milliseconds to minutes.
RELAY_LAG_BUCKETS_S = (0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 300.0)


class RelayInstruments:
    """What an outbox relay (``evsched relay``) sees: the table's backlog and its own sends."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else CollectorRegistry()
        self.registry = registry
        self.pending = Gauge(
            "evsched_outbox_rows_pending",
            "Committed outbox rows not yet relayed to Kafka (read by every relay, leader or not).",
            registry=registry,
        )
        self.oldest_age = Gauge(
            "evsched_outbox_oldest_row_age_seconds",
            "Age of the oldest outbox row waiting, on the database's clock; 0 when none waits.",
            registry=registry,
        )
        self.lag = Histogram(
            "evsched_outbox_relay_lag_seconds",
            "From a row's insert to its deletion after the broker acknowledged its event.",
            buckets=RELAY_LAG_BUCKETS_S,
            registry=registry,
        )
        self.relayed = PromCounter(
            "evsched_outbox_rows_relayed",
            "Outbox rows this relay appended to the events topic and deleted.",
            registry=registry,
        )
        self.failures = PromCounter(
            "evsched_outbox_relay_failures",
            "Batches this relay could not finish, by cause: broker or database.",
            ["cause"],
            registry=registry,
        )
        self.leader = Gauge(
            "evsched_outbox_relay_leader",
            "1 while this relay holds the table's advisory lock (the one that relays), else 0.",
            registry=registry,
        )

    def backlog(self, rows: int, oldest_s: float) -> None:
        self.pending.set(rows)
        self.oldest_age.set(oldest_s)

    def relayed_rows(self, ages_s: Iterable[float]) -> None:
        count = 0
        for age in ages_s:
            self.lag.observe(age)
            count += 1
        self.relayed.inc(count)


# The options of long-running processes that serve their metrics themselves (nodes, workers).
def add_process_collectors(registry: CollectorRegistry) -> None:
    """``process_*`` and ``python_*`` metrics in ``registry``; calling it again adds nothing."""
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        try:
            collector(registry=registry)
        except ValueError:  # already there: prometheus_client refuses duplicated time series
            continue


# ``/readyz``: (ready, text); a process without one is ready while it serves.
Readiness = Callable[[], tuple[bool, str]]


def serve_metrics(
    registry: CollectorRegistry,
    port: int,
    addr: str = "127.0.0.1",
    readiness: Readiness | None = None,
) -> Any:
    """Expose ``registry`` on ``/metrics`` and ``readiness`` on ``/readyz``, on a daemon thread.

    For processes without the API (nodes, workers). The registry also gets the process and
    Python collectors (``process_*``, ``python_*``) that the default registry would have.
    """
    add_process_collectors(registry)
    server = make_server(
        addr,
        port,
        _http_app(registry, readiness),
        server_class=_ThreadingServer,
        handler_class=_QuietHandler,
    )
    threading.Thread(target=server.serve_forever, name="evsched-metrics", daemon=True).start()
    log.info("metrics_serving", addr=addr, port=port, paths=["/metrics", "/readyz"])
    return server


def _http_app(registry: CollectorRegistry, readiness: Readiness | None) -> Any:
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != "/readyz":
            return metrics_app(environ, start_response)
        ready, text = (True, "ready") if readiness is None else readiness()
        status = "200 OK" if ready else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode() + b"\n"]

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""
