"""A node's readiness: which assigned partitions are not running, and why, for ``/readyz``.

A partition whose open or step failed is dropped and retried with a growing wait; until a step
succeeds again it is reported here (a 503 on ``/readyz`` naming it and the reason), in the
``evsched_node_partition_failing`` gauge and in the node's log.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import structlog

log = structlog.get_logger("evsched.node")

# The first retry of a failed partition waits this long; each failure in a row doubles the wait.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


class NodeHealth:
    """Failing partitions of one node; read from the metrics server's thread."""

    def __init__(self, failing_gauge: Any = None) -> None:
        self._lock = threading.Lock()
        self._gauge = failing_gauge
        self.joined = False  # the group assigned partitions at least once
        self._assigned: set[int] = set()
        self._problems: dict[int, str] = {}
        self._failures: dict[int, int] = {}

    def assigned(self, partitions: Iterable[int]) -> None:
        with self._lock:
            self.joined = True
            self._assigned = set(partitions)
            for partition in list(self._problems):
                if partition not in self._assigned:
                    self._clear(partition)

    def failed(self, partition: int, reason: str) -> int:
        """Record a failure; returns how many in a row this partition has had."""
        with self._lock:
            self._problems[partition] = reason
            self._failures[partition] = self._failures.get(partition, 0) + 1
            if self._gauge is not None:
                self._gauge.labels(str(partition)).set(1)
            return self._failures[partition]

    def stepped(self, partition: int) -> None:
        """A step succeeded: the partition runs again (cheap when it was not failing)."""
        if partition not in self._problems:
            return
        with self._lock:
            failures = self._failures.get(partition, 0)
            self._clear(partition)
        log.info("partition_recovered", partition=partition, failures=failures)

    def retry_in_s(self, partition: int) -> float:
        failures = self._failures.get(partition, 0)
        if failures <= 1:
            return RETRY_FIRST_S
        return float(min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** min(failures - 1, 16)))

    def readiness(self) -> tuple[bool, str]:
        """(ready, a one-line-per-problem text for ``/readyz``)."""
        with self._lock:
            if not self.joined:
                return False, "not ready: the node has not joined its consumer group yet"
            problems = sorted(self._problems.items())
        if not problems:
            return True, f"ready: {len(self._assigned)} partitions assigned, none failing"
        return False, "\n".join(f"partition {p} failing: {reason}" for p, reason in problems)

    def _clear(self, partition: int) -> None:
        self._problems.pop(partition, None)
        self._failures.pop(partition, None)
        if self._gauge is not None:
            self._gauge.labels(str(partition)).set(0)
