"""Figures of the side-by-side benchmark (bench/vs_celery.py): per phase, ratios, and a summary.

Pure: it formats what the bench measured. A phase's figures come from the start records of its
jobs (``starts.Start``), its client-side enqueue latencies and the CPU each process used; the
summary takes medians over rounds, per condition (quiet, hog), and ends in one ``key=value`` line.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from e2e import pct
from starts import Start

SIDES = ("evsched", "celery")
PROCESSES = ("broker", "node", "worker", "client")


@dataclass
class Figures:
    """One phase of one side: ``kind`` is ``paced`` or ``burst``, ``condition`` quiet or hog."""

    side: str
    condition: str
    kind: str
    round: int
    enqueue_ms: list[float]
    starts: list[Start]
    first_enqueue_ms: int
    cpu_s: dict[str, float]  # PROCESSES and "rest" (every other process of the machine)
    records: dict[str, int] = field(default_factory=dict)  # per topic, evsched's bursts only

    @property
    def jobs(self) -> int:
        return len(self.starts)

    @property
    def lateness_ms(self) -> list[float]:
        return [s.lateness_ms for s in self.starts if s.run_at_ms]

    @property
    def early(self) -> int:
        return sum(1 for late in self.lateness_ms if late < 0)

    @property
    def jobs_per_s(self) -> float:
        """Jobs started / (first enqueue to the last start)."""
        if not self.starts:
            return 0.0
        last_ms = max(s.started_ns for s in self.starts) / 1e6
        return self.jobs / max(1e-3, (last_ms - self.first_enqueue_ms) / 1000)

    def cpu_per_1k(self, process: str | None = None) -> float:
        """CPU seconds per 1,000 jobs of one process kind, or of all four."""
        used = self.cpu_s[process] if process else sum(self.cpu_s[p] for p in PROCESSES)
        return used / max(1, self.jobs) * 1000

    @property
    def records_per_job(self) -> float:
        return sum(self.records.values()) / max(1, self.jobs)


def phase_line(f: Figures) -> str:
    head = f"r{f.round} {f.condition} {f.side} {f.kind}: {f.jobs} jobs"
    if f.kind == "burst":
        head += f", {f.jobs_per_s:.0f} jobs/s"
    else:
        lat = f.enqueue_ms
        head += f", enqueue p50={pct(lat, 50):.2f} p99={pct(lat, 99):.2f} ms"
    late = f.lateness_ms
    if late:
        head += (
            f"; lateness p50={pct(late, 50):.1f} p99={pct(late, 99):.1f} max={max(late):.0f} ms"
            f" early={f.early}"
        )
    per_1k = " ".join(f"{p}={f.cpu_per_1k(p):.2f}" for p in PROCESSES)
    head += f"; cpu s/1k jobs {per_1k} total={f.cpu_per_1k():.2f} (rest {f.cpu_s['rest']:.1f} s)"
    if f.records:
        topics = " ".join(f"{t}={n / f.jobs:.2f}" for t, n in sorted(f.records.items()))
        head += f"; records/job {f.records_per_job:.2f} ({topics})"
    return head


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "nan"


def ratio_line(ev: Figures, ce: Figures) -> str:
    """evsched / Celery for one pair of phases."""
    parts = [f"r{ev.round} {ev.condition} {ev.kind} evsched/celery:"]
    if ev.kind == "burst":
        parts.append(f"jobs/s x{_ratio(ev.jobs_per_s, ce.jobs_per_s)}")
    else:
        parts.append(f"enqueue p99 x{_ratio(pct(ev.enqueue_ms, 99), pct(ce.enqueue_ms, 99))}")
    parts.append(f"lateness p99 x{_ratio(pct(ev.lateness_ms, 99), pct(ce.lateness_ms, 99))}")
    parts.append(f"cpu/1k jobs x{_ratio(ev.cpu_per_1k(), ce.cpu_per_1k())}")
    return " ".join(parts)


def bound_line(round_: int, condition: str, bound_records_per_s: float, burst: Figures) -> str:
    jobs_bound = bound_records_per_s / burst.records_per_job if burst.records else 0.0
    share = burst.jobs_per_s / jobs_bound * 100 if jobs_bound else float("nan")
    return (
        f"r{round_} {condition} kafka bound {bound_records_per_s:.0f} records/s / "
        f"{burst.records_per_job:.2f} records per job = {jobs_bound:.0f} jobs/s; "
        f"evsched burst {burst.jobs_per_s:.0f} jobs/s = {share:.1f} % of it"
    )


def _median(values: Iterable[float]) -> float:
    data = [v for v in values if not math.isnan(v)]  # a phase with no sample is left out
    return statistics.median(data) if data else float("nan")


def _side_figures(prefix: str, paced: Sequence[Figures], burst: Sequence[Figures]) -> list[str]:
    late = [pct(f.lateness_ms, q) for f in paced for q in (50, 99)]
    figures = {
        "jobs_per_s": _median(f.jobs_per_s for f in burst),
        "enqueue_p50_ms": _median(pct(f.enqueue_ms, 50) for f in paced),
        "enqueue_p99_ms": _median(pct(f.enqueue_ms, 99) for f in paced),
        "lateness_p50_ms": _median(late[0::2]),
        "lateness_p99_ms": _median(late[1::2]),
        "early": float(sum(f.early for f in [*paced, *burst])),
    }
    for kind, group in (("burst", burst), ("paced", paced)):
        figures[f"{kind}_cpu_s_per_1k"] = _median(f.cpu_per_1k() for f in group)
        for p in PROCESSES:
            figures[f"{kind}_cpu_{p}_s_per_1k"] = _median(f.cpu_per_1k(p) for f in group)
    return [f"{prefix}_{k}={v:.2f}" for k, v in figures.items()]


def summary(figures: Sequence[Figures], bounds: dict[str, list[float]]) -> str:
    """Medians over the rounds, per condition and side, with the ratios: one key=value line."""
    parts: list[str] = []
    for condition in dict.fromkeys(f.condition for f in figures):

        def of(side: str, kind: str, c: str = condition) -> list[Figures]:
            return [f for f in figures if (f.condition, f.side, f.kind) == (c, side, kind)]

        for side in SIDES:
            parts += _side_figures(f"{condition}_{side}", of(side, "paced"), of(side, "burst"))
        ev, ce = of("evsched", "burst"), of("celery", "burst")
        rate = _median(f.jobs_per_s for f in ev)
        parts.append(f"{condition}_jobs_ratio={_ratio(rate, _median(f.jobs_per_s for f in ce))}")
        per_job = _median(f.records_per_job for f in ev if f.records)
        bound = _median(bounds.get(condition, []))
        parts.append(f"{condition}_records_per_job={per_job:.2f}")
        parts.append(f"{condition}_kafka_bound_records_per_s={bound:.0f}")
        share = rate / (bound / per_job) * 100 if bound and per_job else float("nan")
        parts.append(f"{condition}_evsched_of_bound_pct={share:.1f}")
    return " ".join(parts)
