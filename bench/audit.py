"""Latency of ``evsched audit`` on an index of a million jobs: read the timeline, refold, read out.

The index is built without a broker: ``bench/histories.py`` generates a realistic log of
``--jobs`` jobs over ``--partitions`` partitions (about five events per job), and one process per
partition folds its records with the node's projector and writes them with ``PartitionIndex``
(batches of 50,000 records), exactly as a node or a rebuild would. The build is kept in
``--index-dir`` and reused by later runs with the same parameters.

Timed per audit, on job ids sampled at random during the build, in loops of their own: wall
clock and the thread's CPU time (which other load on the machine does not inflate) of
``audit()`` (RocksDB prefix scan of the job's timeline, decode of every stored event, refold
with the current fold, the human reading of each entry); then ``--as-of`` audits at the middle
of each timeline; then, on a tenth of the sample, the rendering of the rich table to a string.
The last line is ``key=value`` pairs (with the load average, since a busy machine shows in the
wall-clock tail).

Run: ``.venv/bin/python bench/audit.py [--jobs 1000000] [--partitions 4] [--samples 20000]``.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import random
import shutil
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console

from evsched.adapters.index.store import PartitionIndex
from evsched.operator.audit import audit
from evsched.operator.render import audit_table
from evsched.operator.replica_dir import LocalIndex, open_offline
from evsched.ports import Record
from evsched.runtime.projection.projector import Folded, Projector
from histories import Generator

BATCH = 50_000
SAMPLE_PER_PARTITION = 5_000


def build_partitions(
    index_dir: str, mine: list[int], jobs: int, partitions: int, seed: int
) -> dict[str, Any]:
    """Fold partitions ``mine`` of the generated log into their indexes, in one generator pass."""
    rng = random.Random(seed)
    indexes = {p: PartitionIndex(Path(index_dir) / f"p{p:04d}", p) for p in mine}
    projectors = {p: Projector(index) for p, index in indexes.items()}
    folded = {p: Folded() for p in mine}
    offsets = dict.fromkeys(mine, 0)
    sample: list[str] = []
    started = time.perf_counter()
    generator = Generator(jobs=jobs, partitions=partitions, seed=seed)
    for rec in generator.records(set(mine)):
        p = rec.partition
        record = Record("bench.events", p, offsets[p], rec.log_at, rec.key, rec.value)
        projectors[p].fold([record], folded[p])
        offsets[p] += 1
        if offsets[p] % BATCH == 0:
            projectors[p].commit(folded[p])
            folded[p] = Folded()
        if len(sample) < SAMPLE_PER_PARTITION * len(mine) and rng.random() < 0.01:
            sample.append(rec.key.decode())
    for p, projector in projectors.items():
        projector.commit(folded[p])
        indexes[p].close()
    seconds = time.perf_counter() - started
    return {"events": sum(offsets.values()), "seconds": seconds, "sample": sample}


def build(index_dir: Path, jobs: int, partitions: int, seed: int, processes: int) -> dict[str, Any]:
    marker = index_dir / "built.json"
    wanted = {"jobs": jobs, "partitions": partitions, "seed": seed}
    if marker.exists():
        built = json.loads(marker.read_text())
        if {k: built[k] for k in wanted} == wanted:
            return dict(built)
    shutil.rmtree(index_dir, ignore_errors=True)
    index_dir.mkdir(parents=True)
    groups = [list(range(partitions))[i::processes] for i in range(processes)]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=processes) as pool:
        futures = [
            pool.submit(build_partitions, str(index_dir), group, jobs, partitions, seed)
            for group in groups
            if group
        ]
        parts = [f.result() for f in futures]
    built = {
        **wanted,
        "events": sum(p["events"] for p in parts),
        "build_s": round(time.perf_counter() - started, 1),
        "sample": [job for p in parts for job in p["sample"]],
    }
    marker.write_text(json.dumps(built))
    return built


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_audits(local: LocalIndex, picks: list[str], *, as_of: bool) -> tuple[list[float], ...]:
    """Wall and thread-CPU milliseconds of ``audit`` on each pick (as of its middle offset)."""
    wall, cpu, rows = [], [], []
    middles = {}
    if as_of:
        for job_id in picks:
            found = audit(local.index_of(job_id), job_id)
            assert found is not None
            middles[job_id] = found.rows[len(found.rows) // 2].entry.offset
    gc.collect()
    for job_id in picks:
        index = local.index_of(job_id)
        c0 = time.thread_time_ns()
        t0 = time.perf_counter()
        found = audit(index, job_id, as_of=middles.get(job_id))
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.thread_time_ns() - c0) / 1e6)
        assert found is not None
        rows.append(float(len(found.rows)))
    return wall, cpu, rows


def timed_renders(local: LocalIndex, picks: list[str]) -> list[float]:
    """Milliseconds to render each audit's rich table (what a person sees) to a string."""
    console = Console(file=io.StringIO(), width=160, color_system=None)
    spent = []
    for job_id in picks:
        found = audit(local.index_of(job_id), job_id)
        assert found is not None
        console.file = io.StringIO()
        t0 = time.perf_counter()
        console.print(audit_table(found))
        spent.append((time.perf_counter() - t0) * 1e3)
    return spent


def measure(index_dir: Path, sample: list[str], samples: int, seed: int) -> dict[str, Any]:
    """Audits first (nothing else in the loop), then as-of audits, then renders."""
    rng = random.Random(seed)
    local = open_offline(index_dir)
    picks = [rng.choice(sample) for _ in range(samples)]
    timed_audits(local, picks[:500], as_of=False)  # warm-up: imports, first reads
    wall, cpu, rows = timed_audits(local, picks, as_of=False)
    as_of_wall, _, _ = timed_audits(local, picks, as_of=True)
    render = timed_renders(local, picks[: max(1, samples // 10)])
    local.close()
    return {
        "audit_p50_ms": round(statistics.median(wall), 3),
        "audit_p99_ms": round(percentile(wall, 0.99), 3),
        "audit_max_ms": round(max(wall), 3),
        "audit_cpu_p50_ms": round(statistics.median(cpu), 3),
        "audit_cpu_p99_ms": round(percentile(cpu, 0.99), 3),
        "as_of_p99_ms": round(percentile(as_of_wall, 0.99), 3),
        "render_p50_ms": round(statistics.median(render), 3),
        "render_p99_ms": round(percentile(render, 0.99), 3),
        "events_per_audit_mean": round(statistics.mean(rows), 2),
        "events_per_audit_max": int(max(rows)),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--index-dir", type=Path, default=Path("/tmp/evsched-bench/audit"))
    args = parser.parse_args()
    built = build(args.index_dir, args.jobs, args.partitions, args.seed, args.processes)
    size = sum(f.stat().st_size for f in args.index_dir.rglob("*") if f.is_file())
    print(
        f"index: {built['jobs']} jobs, {built['events']} events in {args.partitions} partitions, "
        f"{size / 1e9:.2f} GB, built in {built['build_s']} s"
    )
    result = measure(args.index_dir, built["sample"], args.samples, args.seed)
    print(json.dumps(result, indent=2))
    pairs = {"jobs": built["jobs"], "events": built["events"], "samples": args.samples, **result}
    print(" ".join(f"{k}={v}" for k, v in pairs.items()))


if __name__ == "__main__":
    main()
