"""Lease planning under a backlog: one planning step of a partition whose queues are mostly full.

A NodeDriver (a real OwnedPartition over a temporary RocksDB index) folds ``--jobs`` due jobs
over ``--queues`` queues of random priorities; then each planning step plans the partition's
leases as if ``--full`` of those queues had no room left and the others ``--room`` each. Two
ways plan the same index, in alternating rounds: ``old`` reads the state of every due job in the
scan's window (``OwnedPartition._plan_read_all``, the way before ``runtime.lease_plan``), ``new``
reads the window's index entries and decodes only the jobs it leases (``LeanLeases.plan``).
Every step checks that both lease the same jobs and leave the same queues waiting. The
projector's state cache is emptied before each step (``--warm`` keeps it): under a backlog
deeper than the cache, the window's states are the oldest jobs and not cached. The last line is
key=value for scripts.

Run: ``PYTHONPATH=src .venv/bin/python bench/planning.py [--jobs 20000] [--rounds 6]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evsched.core.events import JobEnqueued
from evsched.core.planner import PlannerBudgets
from evsched.runtime.partition.budget import QueueLoad
from evsched.runtime.partition.lease_plan import waiting_by_queue
from evsched.runtime.partition.partition import OwnedPartition
from evsched.runtime.projection.projector import Folded
from evsched.testing import NodeDriver


def enqueued(job_id: str, queue: str, priority: int) -> JobEnqueued:
    return JobEnqueued(
        event_id=f"enq-{job_id}", job_id=job_id, emitted_at=0, source="bench", task="t",
        queue=queue, args=b"[1, 2, 3]", priority=priority,
    )  # fmt: skip


async def build(args: argparse.Namespace, root: Path) -> NodeDriver:
    """A partition holding ``--jobs`` due jobs, none leased (the budget is set per step)."""
    rng = random.Random(args.seed)
    # No room anywhere while folding: every job stays scheduled and due.
    driver = NodeDriver(root, budgets=PlannerBudgets(max_unstarted_per_queue=0))
    queues = [f"q{i}" for i in range(args.queues)]
    for start in range(0, args.jobs, 2_000):
        count = min(2_000, args.jobs - start)
        driver.append(
            *(
                enqueued(f"job-{start + i:07d}", rng.choice(queues), rng.randint(0, 2))
                for i in range(count)
            )
        )
        await driver.settle(max_steps=10)
    return driver


def timed(plan: Callable[[], Any], owner: OwnedPartition, warm: bool) -> tuple[float, Any]:
    if not warm:
        owner.projector._cache.clear()
    started = time.perf_counter()
    planned = plan()
    return time.perf_counter() - started, planned


def run(args: argparse.Namespace, driver: NodeDriver) -> dict[str, Any]:
    owner = driver.owner
    budgets = PlannerBudgets(max_unstarted_per_queue=args.room, max_in_flight_per_queue=10**6)
    owner.budgets = owner.lean.budgets = budgets
    full = {f"q{i}": args.room for i in range(args.full)}  # no room left on these
    load = QueueLoad(in_flight=dict(full), unstarted=dict(full))
    now = driver.clock.now_ms()
    ways: dict[str, Callable[[], Any]] = {
        "old": lambda: owner._plan_read_all(Folded(), now, load),
        "new": lambda: owner.lean.plan(Folded(), now, load),
    }
    times: dict[str, list[float]] = {"old": [], "new": []}
    leases = 0
    for round_ in range(args.rounds):
        order = ["old", "new"] if round_ % 2 == 0 else ["new", "old"]
        for _ in range(args.steps):
            plans = {}
            for way in order:
                took, plans[way] = timed(ways[way], owner, args.warm)
                times[way].append(took)
            new, old = plans["new"], plans["old"]
            if new is None or new[0] != old[0] or waiting_by_queue(*new) != waiting_by_queue(*old):
                raise SystemExit("the two ways planned different leases or lines")
            leases = len(plans["old"][0])
    old_ms = statistics.median(times["old"]) * 1_000
    new_ms = statistics.median(times["new"]) * 1_000
    return {
        "jobs": args.jobs,
        "queues": args.queues,
        "full": args.full,
        "scan_limit": owner.scan_limit,
        "leases_per_step": leases,
        "cache": "warm" if args.warm else "cold",
        "old_ms_per_step": round(old_ms, 3),
        "new_ms_per_step": round(new_ms, 3),
        "speedup": round(old_ms / new_ms, 1),
        "identical": "true",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=20_000, help="due jobs in the index")
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--full", type=int, default=3, help="queues with no room left")
    p.add_argument("--room", type=int, default=10, help="leases each other queue has room for")
    p.add_argument("--rounds", type=int, default=6, help="alternating old/new rounds")
    p.add_argument("--steps", type=int, default=20, help="planning steps per round and way")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warm", action="store_true", help="keep the projector's state cache")
    args = p.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    with tempfile.TemporaryDirectory(prefix="evsched-planning-") as tmp:
        driver = asyncio.run(build(args, Path(tmp)))
        try:
            figures = run(args, driver)
        finally:
            driver.close()
    for way in ("old", "new"):
        print(f"{way}: {figures[f'{way}_ms_per_step']} ms per planning step")
    print(" ".join(f"{key}={value}" for key, value in figures.items()))


if __name__ == "__main__":
    main()
