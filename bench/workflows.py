"""Workflows end to end: chains of no-op jobs and groups with a callback, through a broker, node
and worker processes on this machine.

Not a test: it measures. The process stack is ``bench/e2e.py``'s (``Cluster``: a broker unless
``--bootstrap``, ``--nodes`` node and ``--workers`` worker processes, stopped by pid), and so are
its warm-up, its read-back of the events topic (folded with the core fold, so "applied" means
what it means to the node) and its percentiles. After the warm-up, ``--rounds`` rounds, each in
this order so a loaded machine slows all three alike:

1. **baseline**: single no-op jobs, ``--rate`` per second for ``--singles-s`` seconds (open
   loop): enqueue→start = log time of the applied AttemptStarted - log time of the JobEnqueued.
2. **chains**: ``--chains`` chains of ``--chain-length`` no-op steps, ``--parallel`` at a time,
   each step getting the previous result. **Added latency per hop** = the child's applied
   AttemptStarted - the parent's applied AttemptSucceeded (log append times), split into
   success→the child's JobLeased (the parent's node folds the success and sends the resolution,
   the child's node folds it and leases) and JobLeased→AttemptStarted (dispatch and worker).
3. **groups**: ``--groups`` groups of ``--group-size`` no-op members with a callback, one at a
   time. **Completion** = the callback's applied AttemptSucceeded - the log time of the group's
   enqueue (one transaction); **fan-in** = the callback's AttemptStarted - the last member's
   AttemptSucceeded.

Every time is the broker's LogAppendTime of a record of ``<ns>.events``: one clock. Ends with one
line of ``key=value`` pairs::

    hop_p50_ms=<x> hop_p99_ms=<x> hops=<n> chain_p50_ms=<x> group_p50_ms=<x> ...

Run: ``.venv/bin/python bench/workflows.py --bootstrap 127.0.0.1:19092`` (a short run:
``--rounds 1 --chains 10 --groups 1 --singles-s 5 --warmup-s 0``). The workers import this file
as ``workflows:app``, so importing it must stay free of side effects beyond defining the app.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from e2e import (
    Cluster,
    JobTimes,
    define_noop,
    paced,
    pct,
    read_back,
    run_once,
    wait_caught_up,
    wait_succeeded,
    warm_up,
)
from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import App, Task, chain, group

STEP_NAME = "bench.step"


def define_step(target: App) -> Task:
    @target.task(name=STEP_NAME, max_attempts=3)
    async def step(*previous: object) -> None:
        """Does nothing with what its parents passed on: the cost is the scheduler's alone."""

    return step


# The app the worker processes serve (``evsched worker --app workflows:app``, from this folder).
app = App(name="bench-workflows")
define_noop(app)
define_step(app)


@dataclass
class Runs:
    """The job ids of every measured workflow and single job, over all rounds."""

    singles: list[str] = field(default_factory=list)
    chains: list[list[str]] = field(default_factory=list)
    groups: list[list[str]] = field(default_factory=list)  # members, then the callback

    def every_job(self) -> set[str]:
        return {
            *self.singles,
            *(j for c in self.chains for j in c),
            *(j for g in self.groups for j in g),
        }


async def run_singles(cluster: Cluster, noop: Task, runs: Runs) -> None:
    a = cluster.args
    cluster.poll_logs()  # the workflows' successes so far are not the baseline's
    before = cluster.succeeded
    sent = await paced(noop, a.rate, a.singles_s, 0.0, 0.0)
    await wait_succeeded(cluster, before + len(sent.jobs), 120)
    runs.singles += sent.jobs


async def run_chains(client: App, step: Task, runs: Runs, args: argparse.Namespace) -> None:
    """``--chains`` chains, ``--parallel`` lanes each running one chain at a time to its end."""
    left = iter(range(args.chains))

    async def lane() -> None:
        for _ in left:
            steps = [step.s() for _ in range(args.chain_length)]
            handle = await client.enqueue_workflow(chain(*steps))
            await handle.last.result(timeout=300)
            runs.chains.append(handle.job_ids)

    await asyncio.gather(*(lane() for _ in range(min(args.parallel, args.chains))))


async def run_groups(client: App, step: Task, runs: Runs, count: int, size: int) -> None:
    for _ in range(count):
        members = [step.s() for _ in range(size)]
        handle = await client.enqueue_workflow(group(members, callback=step.s()))
        await handle.last.result(timeout=900)
        runs.groups.append(handle.job_ids)


@dataclass
class Figures:
    """Samples in ms, from the log's append times."""

    hop: list[float] = field(default_factory=list)
    hop_lease: list[float] = field(default_factory=list)
    hop_start: list[float] = field(default_factory=list)
    chain: list[float] = field(default_factory=list)
    group: list[float] = field(default_factory=list)
    fan_in: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)


def figures(runs: Runs, times: dict[str, JobTimes]) -> Figures:
    out = Figures()
    for job in runs.singles:
        t = times[job]
        out.baseline.append(float(_at(t.started_at) - t.run_at))
    for steps in runs.chains:
        for parent, child in itertools.pairwise(steps):
            done, c = _at(times[parent].succeeded_at), times[child]
            out.hop.append(float(_at(c.started_at) - done))
            out.hop_lease.append(float(_at(c.leased_at) - done))
            out.hop_start.append(float(_at(c.started_at) - _at(c.leased_at)))
        out.chain.append(float(_at(times[steps[-1]].succeeded_at) - times[steps[0]].run_at))
    for jobs in runs.groups:
        *members, callback = (times[j] for j in jobs)
        enqueued = min(t.run_at for t in [*members, callback])
        out.group.append(float(_at(callback.succeeded_at) - enqueued))
        last = max(_at(t.succeeded_at) for t in members)
        out.fan_in.append(float(_at(callback.started_at) - last))
    return out


def _at(value: int | None) -> int:
    if value is None:
        raise RuntimeError("a measured job has no applied start or success in the log")
    return value


def report(f: Figures, args: argparse.Namespace) -> str:
    rows = [
        ("baseline: single job, enqueue to start", f.baseline),
        ("chain hop: parent's success to child's start", f.hop),
        ("  of which success to the child's lease", f.hop_lease),
        ("  of which lease to start", f.hop_start),
        (f"chain of {args.chain_length}: enqueue to the last success", f.chain),
        (f"group of {args.group_size}: enqueue to the callback's success", f.group),
        ("  fan-in: last member's success to the callback's start", f.fan_in),
    ]
    for name, values in rows:
        print(
            f"{name}: p50={pct(values, 50):.1f} p99={pct(values, 99):.1f} "
            f"max={max(values):.0f} ms (n={len(values)})"
        )
    return (
        f"hop_p50_ms={pct(f.hop, 50):.1f} hop_p99_ms={pct(f.hop, 99):.1f} hops={len(f.hop)} "
        f"hop_lease_p50_ms={pct(f.hop_lease, 50):.1f} hop_start_p50_ms={pct(f.hop_start, 50):.1f} "
        f"chain_p50_ms={pct(f.chain, 50):.0f} group_p50_ms={pct(f.group, 50):.0f} "
        f"group_max_ms={max(f.group):.0f} fanin_p50_ms={pct(f.fan_in, 50):.1f} "
        f"baseline_start_p50_ms={pct(f.baseline, 50):.1f} "
        f"baseline_start_p99_ms={pct(f.baseline, 99):.1f}"
    )


async def run(cluster: Cluster) -> str:
    a = cluster.args
    await ensure_topics(
        cluster.bootstrap, cluster.namespace, event_partitions=a.partitions, queues=["default"]
    )
    cluster.start_engine()
    client = App(cluster.settings, name="bench-client")
    noop, step = define_noop(client), define_step(client)
    runs = Runs()
    async with client:
        await warm_up(cluster, noop)
        for round_number in range(1, a.rounds + 1):
            started = time.monotonic()
            await run_singles(cluster, noop, runs)
            await run_chains(client, step, runs, a)
            await run_groups(client, step, runs, a.groups, a.group_size)
            print(f"round {round_number}: {time.monotonic() - started:.1f} s", flush=True)
    await wait_caught_up(cluster)  # every record of the measured jobs folded and committed
    times = await read_back(cluster.settings, runs.every_job())
    return report(figures(runs, times), a)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chains", type=int, default=40, help="chains per round")
    p.add_argument("--chain-length", type=int, default=10)
    p.add_argument("--parallel", type=int, default=4, help="chains in flight at once")
    p.add_argument("--groups", type=int, default=2, help="groups per round")
    p.add_argument("--group-size", type=int, default=1_000)
    p.add_argument("--singles-s", type=float, default=10.0, help="baseline: seconds per round")
    p.add_argument("--rate", type=float, default=20.0, help="baseline and warm-up: jobs per s")
    p.add_argument("--warmup-s", type=float, default=20.0, help="unmeasured paced load first")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--concurrency", type=int, default=100, help="attempts per worker at once")
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--broker-pid", type=int, help="with --bootstrap: count this pid's CPU")
    p.add_argument("--keep", action="store_true", help="keep the run directory (logs, indexes)")
    args = p.parse_args(argv)
    # What e2e's cluster and warm-up read: no delayed jobs, no profiles, no RSS mode.
    args.delay_s, args.delayed_share, args.rss, args.profile = 0.0, 0.0, False, None
    return args


def main() -> None:
    args = parse()
    run_dir = Path(tempfile.mkdtemp(prefix="evsched-bench-workflows-"))
    print(run_once(Cluster(args, run_dir, app_ref="workflows:app"), run))


if __name__ == "__main__":
    main()
