"""evsched and Celery side by side: the same workloads, in alternation, quiet and beside a CPU hog.

Not a test: it measures. In one run it starts a Kafka broker (unless ``--bootstrap``), an evsched
node and worker (``bench/e2e.py``'s cluster), a Redis server and a Celery worker (acks_late,
prefork ``--celery-concurrency``, default 2), and alternates, round by round (the order of the two
sides swaps each round), for each condition — ``quiet`` and ``hog`` (a busy loop in its own process
session pinned to one core) — the phases of ``bench/e2e.py`` with its load generators:

1. **paced**: ``--rate`` jobs/s for ``--seconds``, a ``--delayed-share`` of them due
   ``--delay-s`` later (evsched: ``run_at``; Celery: an ETA task). Figures: enqueue p50/p99 (the
   client's await of each enqueue; Celery's ``apply_async`` runs on the event loop's thread, as a
   synchronous caller's, unless ``--celery-client thread``) and start lateness p50/p99 with early
   starts counted.
2. **burst**: ``--jobs`` jobs as fast as the client can (same delayed share): jobs/s.

Both sides run the same timed no-op: its body notes its own start time (``bench/starts.py``), so
lateness is the task's start minus the run time the client asked for, the same way for both. Each
phase also reports CPU seconds per 1,000 jobs of the broker (Kafka or Redis), the node (evsched
only), the worker (Celery's with its pool processes) and the client (this process), from
``/proc/<pid>/stat``, and ``rest``: what every other process of the machine used meanwhile.
evsched's bursts count the records they wrote to the namespace's topics (records per job, from the
log), and each condition of each round measures the raw Kafka bound on the same broker
(``bench/kafka_bound.py``): evsched's jobs/s as a share of (bound records/s / records per job).

Ends with one line of ``key=value`` pairs: medians over the rounds, per condition and side.

Run: ``.venv/bin/python bench/vs_celery.py --rounds 3`` (needs ``redis-server`` from the OS
packages and ``pip install -e '.[bench]'``). Ports: ``--redis-port``, ``--broker-port`` and
``--controller-port``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import kafka_bound
from celery_stack import CeleryStack, Hog
from e2e import (
    Cluster,
    Submit,
    _cpu_s,
    _machine_busy_s,
    define_noop,
    flood_with,
    paced_with,
    wait_caught_up,
    wait_succeeded,
    warm_up,
)
from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import App, Task
from starts import STARTS_ENV, StartLog
from timed_noop import define_timed
from vs_celery_report import Figures, bound_line, phase_line, ratio_line, summary


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


class Side(Protocol):
    """One scheduler under test: how to enqueue the timed no-op, its starts, its processes."""

    name: str
    starts: StartLog

    def submit(self, phase: str, delay_s: float) -> Submit: ...
    def cpu(self) -> dict[str, float]: ...
    async def settle(self, jobs: int) -> None: ...


@dataclass
class EvschedSide:
    """evsched: the bench's node and worker, and the client library in this process."""

    cluster: Cluster
    task: Task
    starts: StartLog
    name: str = "evsched"
    succeeded_before: int = 0

    def submit(self, phase: str, delay_s: float) -> Submit:
        self.cluster.poll_logs()
        self.succeeded_before = self.cluster.succeeded

        async def submit(i: int, delayed: bool) -> str:
            if not delayed:
                return await self.task.enqueue(f"{phase}/{i}", 0)
            run_at_ms = _now_ms() + round(delay_s * 1000)
            return await self.task.options(run_at=_at(run_at_ms)).enqueue(f"{phase}/{i}", run_at_ms)

        return submit

    def cpu(self) -> dict[str, float]:
        c = self.cluster
        return {
            "broker": _cpu_s(c.broker_pid) if c.broker_pid is not None else 0.0,
            "node": sum(p.cpu_s() for p in c.nodes),
            "worker": sum(p.cpu_s() for p in c.workers),
        }

    async def settle(self, jobs: int) -> None:
        """Every job of the phase succeeded (the worker wrote AttemptSucceeded)."""
        await wait_succeeded(self.cluster, self.succeeded_before + jobs, 600)


@dataclass
class CelerySide:
    """Celery: Redis and a prefork worker, and Celery's client in this process."""

    stack: CeleryStack
    task: Any  # a Celery task: celery ships no type hints
    starts: StartLog
    pool: ThreadPoolExecutor | None
    name: str = "celery"

    def submit(self, phase: str, delay_s: float) -> Submit:
        loop = asyncio.get_running_loop()

        async def submit(i: int, delayed: bool) -> str:
            run_at_ms = _now_ms() + round(delay_s * 1000) if delayed else 0
            call = functools.partial(
                self.task.apply_async,
                args=(f"{phase}/{i}", run_at_ms),
                eta=_at(run_at_ms) if delayed else None,
            )
            result = call() if self.pool is None else await loop.run_in_executor(self.pool, call)
            return str(result.id)

        return submit

    def cpu(self) -> dict[str, float]:
        return self.stack.cpu()

    async def settle(self, jobs: int) -> None:
        """Nothing after the starts: a Celery no-op has no result to write."""
        self.stack.check()


@dataclass
class Bench:
    """The run: both sides, the hog, and what every phase measured so far."""

    args: argparse.Namespace
    evsched: EvschedSide
    celery: CelerySide
    hog: Hog
    figures: list[Figures] = field(default_factory=list)
    bounds: dict[str, list[float]] = field(default_factory=dict)

    def check(self) -> None:
        self.evsched.cluster.poll_logs()
        self.celery.stack.check()

    def snapshot(self, side: Side) -> dict[str, float]:
        return {**side.cpu(), "client": _cpu_s(os.getpid()), "machine": _machine_busy_s()}

    async def wait_started(self, side: Side, phase: str, jobs: int) -> None:
        a = self.args
        # Generous: on a loaded machine Celery's two processes ran 12 jobs/s.
        deadline = time.monotonic() + 600 + a.delay_s + jobs / 5
        while True:
            side.starts.poll()
            self.check()
            if side.starts.count(phase) >= jobs:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{side.name}: {side.starts.count(phase)}/{jobs} of {phase}")
            await asyncio.sleep(0.05)

    async def phase(self, side: Side, kind: str, condition: str, round_: int) -> Figures:
        a = self.args
        label = f"r{round_}-{condition}-{side.name}-{kind}"
        ns = self.evsched.cluster.namespace
        ends = await kafka_bound.log_ends(self.evsched.cluster.bootstrap, f"{ns}.")
        before = self.snapshot(side)
        submit = side.submit(label, a.delay_s)
        if kind == "paced":
            sent = await paced_with(submit, a.rate, a.seconds, a.delayed_share)
        else:
            sent = await flood_with(submit, a.jobs, a.delayed_share)
        client_s = _cpu_s(os.getpid())  # the client's work ends here; waiting is the bench's
        await self.wait_started(side, label, len(sent.jobs))
        await side.settle(len(sent.jobs))
        after = {**self.snapshot(side), "client": client_s}
        used = {k: after[k] - before[k] for k in after}
        used["rest"] = max(0.0, used.pop("machine") - sum(used.values()))
        f = Figures(
            side=side.name,
            condition=condition,
            kind=kind,
            round=round_,
            enqueue_ms=sent.latencies_ms,
            starts=side.starts.started(label),
            first_enqueue_ms=sent.first_at_ms,
            cpu_s=used,
        )
        if side is self.evsched and kind == "burst":
            await wait_caught_up(self.evsched.cluster)
            f.records = await kafka_bound.count_records(self.evsched.cluster.bootstrap, ends)
        print(phase_line(f), flush=True)
        self.figures.append(f)
        await asyncio.sleep(a.settle_s)  # let the last phase's stragglers (compaction, GC) pass
        return f

    async def condition(self, condition: str, round_: int) -> None:
        """Both sides' paced then burst phases (the order swaps each round), then the bound."""
        a = self.args
        sides: Sequence[Side] = (
            (self.evsched, self.celery) if round_ % 2 else (self.celery, self.evsched)
        )
        if condition == "hog":
            self.hog.start()
        try:
            for kind in ("paced", "burst"):
                pair = {
                    f.side: f for f in [await self.phase(s, kind, condition, round_) for s in sides]
                }
                print(ratio_line(pair["evsched"], pair["celery"]), flush=True)
            bootstrap = self.evsched.cluster.bootstrap
            bound = await kafka_bound.measure(bootstrap, seconds=a.bound_s, partitions=a.partitions)
        finally:
            self.hog.stop()
        self.bounds.setdefault(condition, []).append(bound.records_per_s)
        print(bound_line(round_, condition, bound.records_per_s, pair["evsched"]), flush=True)

    async def warm_up_celery(self) -> None:
        """Jobs until the worker runs them, then the paced load unmeasured, as for evsched."""
        a = self.args
        sent = await flood_with(self.celery.submit("warm-0", 0), 100, 0)
        await self.wait_started(self.celery, "warm-0", len(sent.jobs))
        if a.warmup_s > 0:
            submit = self.celery.submit("warm-1", a.delay_s)
            sent = await paced_with(submit, a.rate, a.warmup_s, a.delayed_share)
            await self.wait_started(self.celery, "warm-1", len(sent.jobs))

    async def run(self) -> str:
        for round_ in range(1, self.args.rounds + 1):
            for condition in self.args.conditions.split(","):
                await self.condition(condition, round_)
        return summary(self.figures, self.bounds)


async def run(args: argparse.Namespace, cluster: Cluster, stack: CeleryStack, hog: Hog) -> str:
    await ensure_topics(
        cluster.bootstrap, cluster.namespace, event_partitions=args.partitions, queues=["default"]
    )
    cluster.start_engine()
    client = App(cluster.settings, name="bench-client")
    noop, timed = define_noop(client), define_timed(client)
    os.environ["BENCH_REDIS_URL"] = stack.url  # read when the Celery app is imported
    import celery_app

    pool = ThreadPoolExecutor(args.celery_threads) if args.celery_client == "thread" else None
    try:
        async with client:
            bench = Bench(
                args,
                EvschedSide(cluster, timed, StartLog(cluster.run_dir / "evsched.starts")),
                CelerySide(stack, celery_app.timed_noop, StartLog(stack.starts_path), pool),
                hog,
            )
            await warm_up(cluster, noop)
            await bench.warm_up_celery()
            return await bench.run()
    finally:
        if pool is not None:
            pool.shutdown()


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="rounds of every condition")
    p.add_argument("--conditions", default="quiet,hog", help="quiet, hog, or both (in this order)")
    p.add_argument("--seconds", type=float, default=20.0, help="paced phase: duration")
    p.add_argument("--rate", type=float, default=500.0, help="paced phase: jobs per second")
    p.add_argument("--jobs", type=int, default=20_000, help="jobs in each burst")
    p.add_argument("--delayed-share", type=float, default=0.2, help="share of delayed jobs")
    p.add_argument("--delay-s", type=float, default=2.0, help="delay of the delayed jobs")
    p.add_argument("--warmup-s", type=float, default=40.0, help="unmeasured paced load first")
    p.add_argument("--settle-s", type=float, default=2.0, help="pause after each phase")
    p.add_argument("--bound-s", type=float, default=5.0, help="raw Kafka bound: producing time")
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=100, help="evsched: attempts per worker")
    p.add_argument("--celery-concurrency", type=int, default=2, help="Celery: prefork processes")
    p.add_argument("--celery-client", choices=["inline", "thread"], default="inline")
    p.add_argument("--celery-threads", type=int, default=4, help="with --celery-client thread")
    p.add_argument("--redis-port", type=int, default=19850)
    p.add_argument("--broker-port", type=int, default=19851, help="the Kafka broker started here")
    p.add_argument("--controller-port", type=int, default=19852)
    p.add_argument("--bootstrap", help="use this Kafka broker instead of starting one")
    p.add_argument("--broker-pid", type=int, help="with --bootstrap: count this pid's CPU")
    p.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = p.parse_args(argv)
    unknown = set(args.conditions.split(",")) - {"quiet", "hog"}
    if unknown:
        p.error(f"--conditions: unknown {', '.join(sorted(unknown))} (quiet, hog)")
    # What e2e's cluster and warm-up read: one node, one worker, no profiles.
    args.nodes, args.workers, args.rss, args.profile = 1, 1, False, None
    return args


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    args = parse()
    # A SIGTERM (timeout, a kill) unwinds like Ctrl-C, so the finally below stops everything.
    signal.signal(signal.SIGTERM, _interrupt)
    run_dir = Path(tempfile.mkdtemp(prefix="evsched-vs-celery-"))
    cluster = Cluster(args, run_dir, app_ref="timed_noop:app")
    stack = CeleryStack(
        run_dir, args.redis_port, args.celery_concurrency, run_dir / "celery.starts"
    )
    hog = Hog()
    os.environ[STARTS_ENV] = str(run_dir / "evsched.starts")  # the evsched worker inherits it
    try:
        cluster.start_broker(args.broker_port, args.controller_port)
        stack.start()
        print(f"evsched {cluster.namespace} on {cluster.bootstrap}, Celery on {stack.url}")
        print(f"logs in {run_dir}", flush=True)
        line = asyncio.run(run(args, cluster, stack, hog))
    except KeyboardInterrupt:
        print("interrupted: stopping everything this run started", flush=True)
        raise SystemExit(130) from None
    finally:
        hog.stop()
        stack.stop()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    print(line)


if __name__ == "__main__":
    main()
