"""The overview's numbers, kept from the replica's commit hook so a page view never scans the index.

``Live.observe_commit`` is one more commit hook beside the metrics': it moves histograms, short
per-second series and the dead-letter groups as batches commit, and wakes the server-sent-event
fan-out (``stream.Fanout``), which builds one snapshot for every open stream. The lifetime
tallies (retries, dead letters...) are not kept here: each partition's index holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

from evsched.core.failures import category_of
from evsched.core.state import FoldedEvent, JobState, Status, Verdict
from evsched.core.tallies import COMPLETIONS

SERIES_S = 300  # seconds of per-second history the charts show
MAX_RUNNING = 200_000  # attempts whose start time is remembered for their processing time
WORKER_EVENTS = frozenset(
    {"AttemptStarted", "LeaseRenewed", "AttemptSucceeded", "AttemptFailed", "AttemptSnoozed"}
)
DECISIONS = frozenset({"JobLeased", "LeaseExpired", "JobPurged"})
PERCENTILES = (50.0, 90.0, 99.0)


def _histogram() -> HdrHistogram:
    return HdrHistogram(1, 24 * 3_600_000, 2)  # milliseconds, 1 ms to a day, 2 digits


@dataclass(slots=True)
class Second:
    """What happened in one second of log time, and the queue depths seen at its end."""

    at_s: int
    started: int = 0
    finished: int = 0
    depth: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class DeadLetters:
    """Dead jobs by id with their (task, error category); seeded once, then kept by the hook."""

    jobs: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    seeded: bool = False

    def seed(self, states: Callable[[], Any]) -> None:
        self.jobs = {s.job_id: _dead_key(s) for s in states() if s.status is Status.DEAD}
        self.seeded = True

    def move(self, after: JobState) -> None:
        if after.status is Status.DEAD:
            self.jobs[after.job_id] = _dead_key(after)
        else:
            self.jobs.pop(after.job_id, None)

    def groups(self) -> list[tuple[str, str, int]]:
        """(task, category, count), most dead first."""
        counts = Counter((task, category) for task, category, _ in self.jobs.values())
        return [(t, c, n) for (t, c), n in counts.most_common()]

    def matching(self, task: str | None, category: str | None) -> list[str]:
        return sorted(
            job_id
            for job_id, (t, c, _) in self.jobs.items()
            if (task is None or t == task) and (category is None or c == category)
        )


def _dead_key(state: JobState) -> tuple[str, str, str]:
    # A job that ran out of attempts by lease expiries has no error of its own.
    error = state.last_error
    if error is None:
        return state.task, "(no error: expired)", state.queue
    return state.task, f"{category_of(error)} / {error.error_type}", state.queue


class Live:
    """Counters of what the replica folded; ``version`` grows with every committed batch."""

    def __init__(self, depth: Callable[[], Mapping[str, int]]) -> None:
        self._depth = depth
        self.series: deque[Second] = deque(maxlen=SERIES_S)
        self.lateness = _histogram()
        self.processing = _histogram()
        self.deciders: dict[int, tuple[str, int]] = {}
        self.workers: dict[str, int] = {}
        self.dead = DeadLetters()
        self.version = 0
        self.last_log_at = 0
        self._starts: dict[tuple[str, int], int] = {}
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self.closed = False

    # --- the commit hook ------------------------------------------------------------------------

    def observe_commit(self, events: Sequence[FoldedEvent]) -> None:
        for folded in events:
            self._observe(folded)
        self.version += 1
        self._changed.set()

    def _observe(self, folded: FoldedEvent) -> None:
        entry, after = folded.entry, folded.after
        self.last_log_at = max(self.last_log_at, entry.log_at)
        if entry.kind in DECISIONS and entry.verdict is Verdict.APPLIED:
            # A refused decision (a forger's, or a zombie node's) decided nothing.
            self.deciders[entry.partition] = (entry.source, entry.log_at)
        if entry.kind in WORKER_EVENTS and entry.verdict is Verdict.APPLIED:
            self.workers[entry.source] = entry.log_at
        if (purged := folded.purged) is not None:
            self.dead.jobs.pop(purged.job_id, None)
            return
        if after is not None and entry.verdict is Verdict.APPLIED:
            self._applied(folded, after)

    def _applied(self, folded: FoldedEvent, after: JobState) -> None:
        entry = folded.entry
        second = self._second(entry.log_at // 1000)
        if entry.kind == "AttemptStarted":
            second.started += 1
            self.lateness.record_value(max(1, entry.log_at - after.run_at))
            if len(self._starts) < MAX_RUNNING:
                self._starts[(after.job_id, after.token)] = entry.log_at
        elif entry.kind in COMPLETIONS:
            second.finished += 1
            began = self._starts.pop((after.job_id, after.token), None)
            if began is not None:
                self.processing.record_value(max(1, entry.log_at - began))
        elif entry.kind == "LeaseExpired":
            self._starts.pop((after.job_id, after.token), None)
        before = folded.before
        if self.dead.seeded and (after.status is Status.DEAD or before is not None):
            self.dead.move(after)

    def _second(self, at_s: int) -> Second:
        """The series' entry for ``at_s``; a new second closes the last one with the depths."""
        if self.series and self.series[-1].at_s >= at_s:
            # Log time per partition is ordered, across partitions nearly: late ones join the last.
            return self.series[-1]
        if self.series:
            self.series[-1].depth = dict(self._depth())
        self.series.append(Second(at_s=at_s))
        return self.series[-1]

    # --- readers ------------------------------------------------------------------------------

    def percentiles(self) -> dict[str, dict[str, float | None]]:
        """p50/p90/p99 in seconds of start lateness and processing time (None before any)."""

        def of(h: HdrHistogram) -> dict[str, float | None]:
            if h.get_total_count() == 0:
                return {f"p{p:g}": None for p in PERCENTILES}
            return {f"p{p:g}": h.get_value_at_percentile(p) / 1000 for p in PERCENTILES}

        return {"lateness_s": of(self.lateness), "processing_s": of(self.processing)}

    def workers_seen(self, within_ms: int = 60_000) -> list[tuple[str, int]]:
        """Workers that wrote an applied attempt event in the last ``within_ms`` of log time."""
        since = self.last_log_at - within_ms
        return sorted((w, at) for w, at in self.workers.items() if at >= since)

    async def changed(self, seen: int, timeout_s: float) -> int | None:
        """The version once it passed ``seen`` or the timeout passed; None once closed."""
        if self.version == seen and not self.closed:
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout_s)
        return None if self.closed else self.version

    async def pause(self, seconds: float) -> None:
        """Wait ``seconds`` unless closed first (a stream's throttle)."""
        if not self.closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), seconds)

    def close(self) -> None:
        """Ends every live stream (at shutdown)."""
        self.closed = True
        self._changed.set()
        self._closing.set()
