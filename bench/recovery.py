"""Recovery after a leader kill: how long a partition goes without a lease, and enqueue latency.

Not a test: it measures. Starts a three-broker cluster, a node and a worker exactly as
``bench/e2e.py --brokers 3`` does (its ``Cluster``, warm-up and paced load, imported), runs a
paced load of no-op jobs for ``--before-s`` seconds, SIGKILLs the broker that leads events
partition 0, and keeps the load going for ``--after-s`` seconds. Read back from the log:

- ``recovery_s``: for each events partition the victim led, the time from the kill to the
  first applied JobLeased (log time) of a job on that partition; the largest of them;
- enqueue latencies (client side, acks=all) of the enqueues started before the kill, and of
  those started from the kill until ``recovery_s`` + 5 s later ("around" it).

The killed broker stays down; everything is stopped by pid at the end. Final line::

    recovery_s=<x> victim_partitions=<n> enqueue_p99_ms_before=<x> enqueue_p99_ms_around=<x>
    enqueue_max_ms_around=<x> failed_enqueues=<n>

Run: ``.venv/bin/python bench/recovery.py --rate 200 --before-s 20 --after-s 60``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from e2e import (
    Cluster,
    Submit,
    _script,
    define_noop,
    noop_submit,
    paced_with,
    pct,
    read_back,
    run_once,
    warm_up,
)
from evsched.adapters.kafka.partition_log import partition_for
from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.client import App, Task
from evsched.errors import EvschedError


@dataclass
class Timed:
    """Each enqueue's start (wall ms) and latency (ms); failed ones by start time."""

    started_ms: list[float] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    failed_ms: list[float] = field(default_factory=list)


def timed_submit(task: Task, timed: Timed) -> Submit:
    """The no-op enqueue, timed; a failed enqueue is counted, not raised (the load goes on)."""
    submit = noop_submit(task, 0.0)

    async def one(i: int, delayed: bool) -> str:
        started, t0 = time.time() * 1000, time.perf_counter()
        try:
            job = await submit(i, delayed)
        except EvschedError:
            timed.failed_ms.append(started)
            return ""
        timed.started_ms.append(started)
        timed.latencies_ms.append((time.perf_counter() - t0) * 1000)
        return job

    return one


async def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        [found] = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return {int(p["partition"]): int(p["leader"]) for p in found["partitions"]}


def broker_pids(cluster: Cluster) -> dict[int, int]:
    """KRaft node id -> pid, from ``evsched kafka status --json``."""
    command = [_script("evsched"), "kafka", "status", "--json", "--data-dir"]
    command.append(str(cluster.broker_dir))
    status = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
    return {i: int(b["pid"]) for i, b in enumerate(status["brokers"], start=1) if b["pid"]}


async def kill_leader(cluster: Cluster, delay_s: float) -> tuple[float, set[int]]:
    """After ``delay_s``, SIGKILL events partition 0's leader: (kill time ms, partitions it led)."""
    await asyncio.sleep(delay_s)
    led = await leaders(cluster.bootstrap, Topics(cluster.namespace).events)
    victim = led[0]
    killed_at = time.time() * 1000
    os.kill(broker_pids(cluster)[victim], signal.SIGKILL)
    victims = {p for p, leader in led.items() if leader == victim}
    print(f"killed broker {victim} (leader of events partitions {sorted(victims)})")
    return killed_at, victims


async def run(cluster: Cluster) -> str:
    a = cluster.args
    await ensure_topics(
        cluster.bootstrap, cluster.namespace, event_partitions=a.partitions, queues=["default"]
    )
    cluster.start_engine()
    timed = Timed()
    async with App(cluster.settings, name="bench-client") as client:
        task = define_noop(client)
        await warm_up(cluster, task)
        load = asyncio.create_task(
            paced_with(timed_submit(task, timed), a.rate, a.before_s + a.after_s, 0.0)
        )
        killed_at, victims = await kill_leader(cluster, a.before_s)
        sent = await load
    jobs = {j for j in sent.jobs if j}
    times = await read_back(cluster.settings, jobs)
    firsts: dict[int, float] = {}
    for job, t in times.items():
        part = partition_for(job, a.partitions)
        if part in victims and t.leased_at is not None and t.leased_at > killed_at:
            firsts[part] = min(firsts.get(part, float("inf")), (t.leased_at - killed_at) / 1000)
    missing = victims - set(firsts)
    if missing:
        raise RuntimeError(f"no lease after the kill on partitions {sorted(missing)}")
    recovery = max(firsts.values())
    pairs = list(zip(timed.started_ms, timed.latencies_ms, strict=True))
    before = [lat for at, lat in pairs if at < killed_at]
    around = [lat for at, lat in pairs if killed_at <= at <= killed_at + (recovery + 5) * 1000]
    print(f"recovery per partition (s): {dict(sorted(firsts.items()))}")
    return (
        f"recovery_s={recovery:.2f} victim_partitions={len(victims)} "
        f"enqueue_p99_ms_before={pct(before, 99):.2f} enqueue_p99_ms_around={pct(around, 99):.2f} "
        f"enqueue_max_ms_around={max(around, default=float('nan')):.1f} "
        f"failed_enqueues={len(timed.failed_ms)}"
    )


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=200.0, help="paced load: jobs per second")
    p.add_argument("--before-s", type=float, default=20.0, help="load before the kill")
    p.add_argument("--after-s", type=float, default=60.0, help="load after the kill")
    p.add_argument("--warmup-s", type=float, default=10.0, help="unmeasured paced load first")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = p.parse_args(argv)
    # What e2e's Cluster and warm-up read: a three-broker cluster started here, no delayed jobs.
    args.brokers, args.bootstrap, args.broker_pid = 3, None, None
    args.delay_s, args.delayed_share, args.rss = 0.0, 0.0, False
    return args


def main() -> None:
    args = parse()
    print(run_once(Cluster(args, Path(tempfile.mkdtemp(prefix="evsched-recovery-"))), run))


if __name__ == "__main__":
    main()
