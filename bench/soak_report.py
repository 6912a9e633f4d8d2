"""The soak's figures: resource samples over time, and per-chunk enqueue and lateness percentiles.

Pure bookkeeping, no I/O beyond reading ``/proc`` and directory sizes, so the verdicts
(``flatness``) can be unit-tested on made-up samples.
"""

from __future__ import annotations

import os
import statistics
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from e2e import pct

# The resources that must stay flat.
JUDGED = ("node_disk_mb", "api_disk_mb", "node_rss_mb", "api_rss_mb", "worker_rss_mb")
# What the soak samples, in the order it prints them.
SAMPLED = ("live_jobs", *JUDGED, "node_sst_mb", "api_sst_mb", "node_wal_mb", "api_wal_mb")
# Shown, not judged: live jobs follow from the judged ones, and the table files (the index's
# data) and write-ahead logs say where disk goes (the rest is RocksDB's info log and MANIFEST).
SHOWN = tuple(name for name in SAMPLED if name not in JUDGED)
FLAT_PCT = 10.0


def dir_mb(path: Path, suffix: str = "") -> float:
    """Bytes on disk under ``path`` (allocated blocks, so sparse or preallocated files count
    what they take) of the files whose names end in ``suffix``, in MB; 0 when it does not
    exist."""
    return dir_mb_by(path, (suffix,))[suffix]


def dir_mb_by(path: Path, suffixes: Sequence[str]) -> dict[str, float]:
    """``dir_mb`` for each of ``suffixes`` ("" for every file), in one walk of ``path``."""
    totals = dict.fromkeys(suffixes, 0)
    for root, _, files in os.walk(path):
        for name in files:
            ends = [suffix for suffix in suffixes if name.endswith(suffix)]
            if not ends:
                continue
            try:
                size = os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:  # a RocksDB file compacted away meanwhile
                continue
            for suffix in ends:
                totals[suffix] += size
    return {suffix: total / (1 << 20) for suffix, total in totals.items()}


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float  # seconds since the load started
    sent: int  # jobs enqueued by then
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class Flatness:
    """One resource after warm-up: its first and last third's medians and the change between."""

    name: str
    first: float
    last: float
    low: float
    high: float

    @property
    def change_pct(self) -> float:
        return (self.last - self.first) / self.first * 100 if self.first else 0.0

    @property
    def flat(self) -> bool:
        return abs(self.change_pct) <= FLAT_PCT


def flatness(samples: Sequence[Sample], warmup_s: float, name: str) -> Flatness | None:
    """Whether ``name`` stayed flat after ``warmup_s``: the median of the last third of the
    samples against the median of the first third (medians, so one compaction or GC does not
    decide); None with fewer than three samples after warm-up."""
    values = [s.values[name] for s in samples if s.at_s >= warmup_s and name in s.values]
    if len(values) < 3:
        return None
    third = max(1, len(values) // 3)
    return Flatness(
        name=name,
        first=statistics.median(values[:third]),
        last=statistics.median(values[-third:]),
        low=min(values),
        high=max(values),
    )


@dataclass
class Chunk:
    """Enqueue latencies (ms) and start lateness (ms) of the jobs numbered into one chunk."""

    enqueue_ms: array[float] = field(default_factory=lambda: array("d"))
    lateness_ms: array[float] = field(default_factory=lambda: array("d"))

    def line(self, number: int, size: int) -> str:
        e, late = self.enqueue_ms, self.lateness_ms
        return (
            f"jobs {number * size:>9,}-{(number + 1) * size - 1:>9,}: enqueue p50={pct(e, 50):.2f} "
            f"p99={pct(e, 99):.2f} ms ({len(e)}), lateness p50={pct(late, 50):.1f} "
            f"p99={pct(late, 99):.1f} ms ({len(late)} delayed)"
        )


@dataclass
class Chunks:
    """Per-chunk figures, chunk ``i // size`` for job number ``i``."""

    size: int
    chunks: dict[int, Chunk] = field(default_factory=dict)

    def of(self, number: int) -> Chunk:
        return self.chunks.setdefault(number // self.size, Chunk())

    def lines(self) -> list[str]:
        return [self.chunks[n].line(n, self.size) for n in sorted(self.chunks)]

    def ends(self) -> tuple[Chunk, Chunk]:
        """The first and the last whole chunk (the last partial one when there is no other)."""
        numbers = sorted(self.chunks)
        return self.chunks[numbers[0]], self.chunks[numbers[-1]]


def report(samples: Sequence[Sample], chunks: Chunks, warmup_s: float) -> dict[str, object]:
    """Print the verdicts and the per-chunk table; the figures for the last line."""
    figures: dict[str, object] = {}
    verdicts = [f for name in JUDGED if (f := flatness(samples, warmup_s, name)) is not None]
    shown = [f for name in SHOWN if (f := flatness(samples, warmup_s, name)) is not None]
    for f in [*verdicts, *shown]:
        verdict = "flat" if f.flat else "NOT FLAT"
        print(
            f"{f.name}: {f.first:.1f} -> {f.last:.1f} ({f.change_pct:+.1f} %), "
            f"range {f.low:.1f}-{f.high:.1f} after warm-up: {verdict}"
        )
        figures[f"{f.name}_change_pct"] = round(f.change_pct, 1)
    figures["flat"] = str(bool(verdicts) and all(f.flat for f in verdicts)).lower()
    for line in chunks.lines():
        print(line)
    first, last = chunks.ends()
    figures.update(_ends("enqueue", first.enqueue_ms, last.enqueue_ms, 2))
    figures.update(_ends("lateness", first.lateness_ms, last.lateness_ms, 1))
    return figures


def _ends(
    name: str, first: Iterable[float], last: Iterable[float], digits: int
) -> dict[str, float]:
    a, b = list(first), list(last)
    return {
        f"{name}_p50_first_ms": round(pct(a, 50), digits),
        f"{name}_p50_last_ms": round(pct(b, 50), digits),
        f"{name}_p99_first_ms": round(pct(a, 99), digits),
        f"{name}_p99_last_ms": round(pct(b, 99), digits),
    }
