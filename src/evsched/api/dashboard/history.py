"""A job's history for the dashboard: its timeline as bars per token, and its state as of an offset.

The index keeps every event's bytes beside its timeline entry, so time travel needs no log
scan: the job's stored events up to the offset are decoded and folded again with the pure fold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from evsched.adapters.index.store import PartitionIndex
from evsched.core.state import JobState, TimelineEntry, Verdict
from evsched.errors import DecodeError
from evsched.runtime.projection.refold import paused_in, refold

ENDS = frozenset({"AttemptSucceeded", "AttemptFailed", "AttemptSnoozed", "LeaseExpired"})
JOB_ROW = "job"


@dataclass(slots=True)
class Bar:
    """One token's span: leased at ``leased_at``, running from ``started_at`` to ``ended_at``."""

    token: int
    leased_at: int
    started_at: int | None = None
    ended_at: int | None = None
    outcome: str = "open"


@dataclass(slots=True)
class Picture:
    """What the timeline chart draws: bars per token and every event as a marked point."""

    origin: int
    end: int
    bars: list[Bar] = field(default_factory=list)
    points: list[dict[str, Any]] = field(default_factory=list)

    def chart(self) -> dict[str, Any]:
        """The chart's data, times in seconds since the first event (JSON for the page)."""

        def s(at: int | None) -> float:
            return round(((self.end if at is None else at) - self.origin) / 1000, 3)

        rows = [JOB_ROW, *(f"token {b.token}" for b in self.bars)]
        return {
            "rows": rows,
            "leased": [
                {"y": f"token {b.token}", "x": [s(b.leased_at), s(b.started_at or b.ended_at)]}
                for b in self.bars
            ],
            "running": [
                {"y": f"token {b.token}", "x": [s(b.started_at), s(b.ended_at)], "o": b.outcome}
                for b in self.bars
                if b.started_at is not None
            ],
            "points": [{**p, "x": s(p["at"])} for p in self.points],
        }


def picture(entries: list[TimelineEntry], now_ms: int) -> Picture:
    """Leases and attempts of ``entries`` as bars, each event a point on its token's row."""
    origin = entries[0].log_at if entries else now_ms
    drawn = Picture(origin=origin, end=max([now_ms, *(e.log_at for e in entries)]))
    bars: dict[int, Bar] = {}
    for entry in entries:
        token = entry.token
        applied = entry.verdict is Verdict.APPLIED
        if applied and entry.kind == "JobLeased" and token is not None:
            bars[token] = Bar(token=token, leased_at=entry.log_at)
        if applied and entry.kind == "JobCancelled":
            for open_bar in bars.values():
                if open_bar.ended_at is None:
                    _advance(open_bar, entry)
        bar = bars.get(token) if token is not None else None
        if bar is not None and applied:
            _advance(bar, entry)
        drawn.points.append(
            {
                "y": JOB_ROW if bar is None else f"token {bar.token}",
                "at": entry.log_at,
                "kind": entry.kind,
                "verdict": entry.verdict.value,
                "reason": entry.reason,
                "offset": entry.offset,
            }
        )
    drawn.bars = sorted(bars.values(), key=lambda b: b.token)
    return drawn


def _advance(bar: Bar, entry: TimelineEntry) -> None:
    if entry.kind == "AttemptStarted":
        bar.started_at = entry.log_at
    elif entry.kind in ENDS or entry.kind == "JobCancelled":
        bar.ended_at = entry.log_at
        bar.outcome = entry.kind


def state_as_of(index: PartitionIndex, job_id: str, as_of: int) -> JobState | None:
    """The job's state after its events up to offset ``as_of`` (None before its first)."""
    state: JobState | None = None
    base = index.run_base(job_id)  # earlier runs left the index: start where the kept ones do
    if base is not None and as_of >= base[0]:
        state = base[1]
    paused = paused_in(index)
    for entry, raw in index.timeline_events(job_id, schedule=False):
        if entry.offset > as_of:
            break
        try:
            after = refold(state, entry, raw, paused).after
        except DecodeError:  # the index keeps only events that decoded; nothing to fold
            continue
        state = after if isinstance(after, JobState) else None
    return state
