"""A node's partitions as ``/readyz`` shows them: each one's lifecycle phase, and what is wrong.

Every phase change goes through ``move``, which checks it against ``runtime.node.lifecycle`` and
logs it. A partition whose open or step failed is FAILED and reopened after a growing wait; until a
step succeeds again it is reported here (a 503 on ``/readyz`` naming it and the reason), in the
``evsched_node_partition_failing`` gauge and in the node's log. A partition whose index is being
rebuilt from the log is not ready either.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from evsched.adapters.clock import monotonic_s
from evsched.runtime.node.lifecycle import OPEN, Phase, check

log = structlog.get_logger("evsched.node")

# The first retry of a failed partition waits this long; each failure in a row doubles the wait.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


class NodeHealth:
    """The phase of each assigned partition of one node; read from the metrics server's thread."""

    def __init__(
        self,
        failing_gauge: Any = None,
        monotonic: Callable[[], float] = monotonic_s,
        logger: Any = log,
    ) -> None:
        self._lock = threading.Lock()
        self.log = logger
        self._monotonic = monotonic
        self._gauge = failing_gauge
        self.joined = False  # the group assigned partitions at least once
        self._phases: dict[int, Phase] = {}
        self._problems: dict[int, str] = {}
        self._failures: dict[int, int] = {}
        self._retry_at: dict[int, float] = {}

    def phase(self, partition: int) -> Phase | None:
        return self._phases.get(partition)

    def phases(self) -> dict[int, Phase]:
        with self._lock:
            return dict(self._phases)

    def move(self, partition: int, new: Phase, **context: Any) -> None:
        """Change the partition's phase; InvalidTransition (a bug) when the table forbids it."""
        with self._lock:
            old = self._phases.get(partition)
            check(partition, old, new)
            self._phases[partition] = new
        self.log.info(
            "partition_phase",
            partition=partition,
            old=None if old is None else old.value,
            new=new.value,
            **context,
        )

    def assigned(self, partitions: Iterable[int]) -> None:
        """A new assignment: its closed or unknown partitions become ASSIGNED, others are gone."""
        partitions = set(partitions)
        with self._lock:
            self.joined = True
            for partition in list(self._phases):
                if partition not in partitions and self._phases[partition] not in OPEN:
                    del self._phases[partition]
                    self._clear(partition)
        for partition in sorted(partitions):
            if self._phases.get(partition) in (None, Phase.CLOSED):
                self.move(partition, Phase.ASSIGNED)

    def closed(self, partition: int) -> None:
        """Revoked: any phase without an open runner ends here (CLOSING ones too)."""
        if self._phases.get(partition) not in (None, Phase.CLOSED):
            self.move(partition, Phase.CLOSED)
        with self._lock:
            self._clear(partition)

    def restoring(self, partition: int, reason: str) -> None:
        self.move(partition, Phase.RESTORING, reason=reason)
        with self._lock:
            self._problems[partition] = f"restoring: {reason}"

    def failed(self, partition: int, reason: str, retry_in_s: float | None = None) -> int:
        """Mark it FAILED, to reopen after a growing wait (or ``retry_in_s``); failures in a row."""
        self.move(partition, Phase.FAILED, reason=reason)
        with self._lock:
            self._problems[partition] = f"failing: {reason}"
            failures = self._failures[partition] = self._failures.get(partition, 0) + 1
            wait_s = self.retry_in_s(partition) if retry_in_s is None else retry_in_s
            self._retry_at[partition] = self._monotonic() + wait_s
            if self._gauge is not None:
                self._gauge.labels(str(partition)).set(1)
            return failures

    def retry_due(self, partition: int) -> bool:
        """Whether the partition is FAILED and its wait is over."""
        if self._phases.get(partition) is not Phase.FAILED:
            return False
        return self._retry_at.get(partition, 0.0) <= self._monotonic()

    def stepped(self, partition: int, *, caught_up: bool) -> None:
        """A step succeeded: the partition runs (cheap when it was running and not failing)."""
        if caught_up and self._phases.get(partition) is Phase.CATCHING_UP:
            self.move(partition, Phase.RUNNING)
        if partition not in self._problems:
            return
        with self._lock:
            failures = self._failures.get(partition, 0)
            self._clear(partition)
        self.log.info("partition_recovered", partition=partition, failures=failures)

    def retry_in_s(self, partition: int) -> float:
        failures = self._failures.get(partition, 0)
        if failures <= 1:
            return RETRY_FIRST_S
        return float(min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** min(failures - 1, 16)))

    def readiness(self) -> tuple[bool, str]:
        """(ready, a one-line-per-problem text for ``/readyz``, then every partition's phase)."""
        with self._lock:
            if not self.joined:
                return False, "not ready: the node has not joined its consumer group yet"
            problems = sorted(self._problems.items())
            phases = sorted(self._phases.items())
        listing = "phases: " + (", ".join(f"p{p} {phase.value}" for p, phase in phases) or "none")
        if not problems:
            return True, f"ready: {len(phases)} partitions assigned, none failing\n{listing}"
        lines = [f"partition {p} {problem}" for p, problem in problems]
        return False, "\n".join([*lines, listing])

    def _clear(self, partition: int) -> None:
        self._problems.pop(partition, None)
        self._failures.pop(partition, None)
        self._retry_at.pop(partition, None)
        if self._gauge is not None:
            self._gauge.labels(str(partition)).set(0)
