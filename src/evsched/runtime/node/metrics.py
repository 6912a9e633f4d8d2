"""A node's Prometheus instruments: what it folds (verdicts, lateness) and what it does."""

from __future__ import annotations

from dataclasses import dataclass

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
