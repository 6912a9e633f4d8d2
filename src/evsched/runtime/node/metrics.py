"""A node's Prometheus instruments: what it folds (verdicts, lateness) and what it does."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

from evsched.metrics import Metrics, NodeInstruments
from evsched.runtime.projection.waiting import WaitingForWorker


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    """A node's Prometheus instruments: what it folds (verdicts, lateness) and what it does."""

    folded: Metrics
    node: NodeInstruments
    waiting: WaitingForWorker

    @classmethod
    def create(cls) -> NodeMetrics:
        # A node folds only the partitions it owns: no jobs-by-status gauge (the API has it).
        folded = Metrics(job_counts=False)
        waiting = WaitingForWorker(folded.registry)
        folded.followers.append(waiting.observe)
        return cls(folded=folded, node=NodeInstruments(folded.registry), waiting=waiting)

    def watch_presence(
        self, held: Callable[[], Set[str]], workers: Callable[[], dict[str, int]]
    ) -> None:
        """The node's view of the workers (``runtime.partition.presence``), read at scrape time:
        ``evsched_queue_without_worker`` for the queues it holds jobs of, and
        ``evsched_queue_workers``."""
        self.waiting.watch_held(held)
        self.folded.registry.register(_Workers(held, workers))


class _Workers:
    """``evsched_queue_workers{queue}``: live worker-pool members per queue, as the node saw."""

    def __init__(self, held: Callable[[], Set[str]], workers: Callable[[], dict[str, int]]) -> None:
        self._held = held
        self._workers = workers

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "evsched_queue_workers",
            "Worker pool members holding partitions of the queue's dispatch topic, as the node "
            "last saw; 0 for a queue whose due jobs it holds for want of a worker.",
            labels=["queue"],
        )
        counts = dict.fromkeys(self._held(), 0) | self._workers()
        for queue in sorted(counts):
            family.add_metric([queue], counts[queue])
        yield family
