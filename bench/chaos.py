"""Chaos soak: many jobs under kills, freezes, a broker restart and hostile records, then an audit.

Not a test: it soaks and reports. On a broker of its own (free loopback ports, never a shared
one) it starts ``--nodes`` nodes and ``--workers`` workers (bench/chaos_cluster.py) and offers
``--jobs`` jobs (or ``--duration-s`` of them) at ``--rate``/s, open loop; a share fails
transiently, a share for good (bench/chaos_app.py). While the load runs it SIGKILLs a node
every ``--node-kill-every-s`` (back after ``--node-down-s``), SIGKILLs a worker every
``--worker-kill-every-s`` (replaced at once), SIGSTOPs a worker for ``--freeze-s`` (past its
``--lease-s``) every ``--freeze-every-s``, SIGKILLs the broker once at ``--broker-kill-at`` of
the load and starts it again after ``--broker-down-s``, and every ``--hostile-every-s`` writes
hostile records as a foreign producer (bench/chaos_hostile.py). A 0 interval turns a fault off.

Then it waits until every acknowledged job is terminal, or nothing moved for ``--settle-s``;
stops the engine; reads the effects topic; runs ``evsched rebuild --verify`` against each node's
data dir; and audits (bench/chaos_audit.py: an independent model, not the fold, fed from the
events topic while the soak runs). The last line is ``key=value`` pairs: lost, dup_successes,
dup_effects, stale_effects, missing_effects, dead_unstarted, unstarted_expiries, late_starts,
starts_after_terminal, undecodable vs injected_garbage, digest_match (with rebuild_errors and
live_behind: partitions no node index reached), node/worker stall p50/max (seconds), and
enqueue-to-done p50/p99/max of succeeded jobs; docs/bench-log.md ("Chaos soak") defines each.

Run from the repo: ``PYTHONPATH=$PWD/src .venv/bin/python bench/chaos.py --jobs 5000 --rate 50``
(nodes and workers inherit ``PYTHONPATH``; ``--keep`` keeps their logs and indexes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from chaos_app import define
from chaos_audit import Auditor
from chaos_cluster import Soak, now_ms
from chaos_hostile import KINDS, Hostile
from chaos_topics import Follower, read_effects
from e2e import node_caught_up, open_loop, pct, wait_for
from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import App, Task

ENQUEUE_TIMEOUT_S = 30.0


# --- load and faults --------------------------------------------------------------------------


async def offer(tasks: dict[str, Task], args: argparse.Namespace, acked: set[str]) -> int:
    """Open-loop load of ``--jobs`` at ``--rate``; acknowledged ids go to ``acked``; failures."""
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        share = (i * 7919 % 1000) / 1000  # spread the kinds evenly over the run
        if share < args.broken_share:
            call = tasks["broken"].enqueue()
        elif share < args.broken_share + args.flaky_share:
            call = tasks["flaky"].enqueue(1 + i % 2)
        else:
            call = tasks["noop"].enqueue()
        try:
            acked.add(await asyncio.wait_for(call, ENQUEUE_TIMEOUT_S))
        except Exception:  # not acknowledged: not owed (the broker may be down)
            failures += 1

    await open_loop(args.jobs, args.rate, one)
    return failures


async def every(
    period_s: float, action: Callable[[], Awaitable[None]], stop: asyncio.Event
) -> None:
    """Run ``action`` every ``period_s`` (first after one period) until ``stop``; 0: never."""
    if period_s <= 0:
        return
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), period_s)
        if stop.is_set():
            return
        await action()


async def once_at(
    delay_s: float, action: Callable[[], Awaitable[None]], stop: asyncio.Event
) -> None:
    if delay_s < 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), delay_s)
    if not stop.is_set():
        await action()


async def watch_logs(soak: Soak, stop: asyncio.Event) -> None:
    while not stop.is_set():
        soak.poll_logs()
        soak.revive()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


def fault_loops(soak: Soak, hostile: Hostile, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    a = soak.args
    load_s = a.jobs / a.rate
    loops = [
        every(a.node_kill_every_s, soak.kill_node, stop),
        every(a.worker_kill_every_s, soak.kill_worker, stop),
        every(a.freeze_every_s, soak.freeze_worker, stop),
        every(a.hostile_every_s, hostile.round, stop),
        once_at(a.broker_kill_at * load_s if a.broker_kill_at >= 0 else -1, soak.kill_broker, stop),
    ]
    return [asyncio.create_task(loop) for loop in loops]


async def warm_up(soak: Soak, tasks: dict[str, Task], auditor: Auditor) -> None:
    """Before any fault: every partition owned and a few jobs done (not counted in the audit)."""
    await wait_for(soak, soak.all_owned, 300, "nodes to own every partition")
    warm = [await tasks["noop"].enqueue() for _ in range(10 * soak.args.workers)]
    deadline = time.monotonic() + 300
    while not all(auditor.is_terminal(j) for j in warm):
        if time.monotonic() > deadline:
            raise TimeoutError("the warm-up jobs did not finish in 300 s")
        await asyncio.sleep(0.2)  # the follower feeds the auditor meanwhile


async def drain(soak: Soak, follower: Follower, auditor: Auditor, acked: set[str]) -> int:
    """Wait until every acknowledged job is terminal, or nothing moved for ``--settle-s``."""
    a = soak.args
    deadline = time.monotonic() + a.drain_timeout_s
    last, still_since, printed_at = -1, time.monotonic(), 0.0
    while time.monotonic() < deadline:
        await follower.read(500)
        pending = sum(1 for j in acked if not auditor.is_terminal(j))
        if pending == 0:
            return 0
        if pending != last:
            if time.monotonic() - printed_at > 10:  # a line every 10 s at most
                print(f"drain: {pending} acknowledged jobs not terminal yet", flush=True)
                printed_at = time.monotonic()
            last, still_since = pending, time.monotonic()
        elif time.monotonic() - still_since > a.settle_s:
            return pending
    return last


async def nodes_caught_up(soak: Soak, timeout_s: float) -> bool:
    """Whether the nodes committed to the log end (they have published every effect)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await node_caught_up(soak):
            return True
        await asyncio.sleep(1)
    return False


# --- the run ----------------------------------------------------------------------------------


async def soak_run(soak: Soak) -> dict[str, Any]:
    a = soak.args
    await ensure_topics(
        soak.bootstrap, soak.namespace, event_partitions=a.partitions, queues=["default"]
    )
    soak.start_engine()
    acked: set[str] = set()
    hostile = Hostile(soak.bootstrap, soak.namespace, kinds=tuple(a.hostile), seed=a.seed)
    auditor = Auditor(acknowledged=acked, injected=hostile.injected)
    follower = Follower(soak, auditor)
    await follower.start()
    await hostile.start()
    stop_follow, stop_watch = asyncio.Event(), asyncio.Event()
    following = asyncio.create_task(follower.follow(stop_follow))
    watching = asyncio.create_task(watch_logs(soak, stop_watch))
    try:
        async with App(soak.settings, name="chaos-client") as client:
            run = await load(soak, client, hostile, auditor, acked)
        stop_follow.set()
        await following
        run["pending_at_end"] = await drain(soak, follower, auditor, acked)
        stop_watch.set()
        await watching
        run["nodes_caught_up"] = await nodes_caught_up(soak, 60)
        await follower.catch_up()
        ends = await follower.ends()
        auditor.effects(await read_effects(soak))
    finally:
        await hostile.stop()
        await follower.stop()
    soak.stop_engine()
    auditor.injected_garbage = hostile.sent["garbage"]
    return figures(soak, auditor, hostile, run, ends)


async def load(
    soak: Soak, client: App, hostile: Hostile, auditor: Auditor, acked: set[str]
) -> dict[str, Any]:
    """Warm up, then offer the jobs while the faults run; what the load phase measured."""
    tasks = define(client)
    await warm_up(soak, tasks, auditor)
    started = time.monotonic()
    stop_faults = asyncio.Event()
    loops = fault_loops(soak, hostile, stop_faults)
    failed = await offer(tasks, soak.args, acked)
    stop_faults.set()
    await asyncio.gather(*loops)
    return {"enqueue_failed": failed, "load_s": round(time.monotonic() - started, 1)}


def figures(
    soak: Soak, auditor: Auditor, hostile: Hostile, run: dict[str, Any], ends: dict[int, int]
) -> dict[str, Any]:
    """The audit, the rebuild check and the counts, as one flat mapping for the last line."""
    findings = auditor.findings(soak.faults)
    _print_samples(findings)
    _print_stalls(auditor, soak)
    return {
        "jobs": soak.args.jobs,
        **run,
        **findings.figures(),
        **rebuild_figures(soak.rebuild_verify(), ends),
        **_done_figures(auditor, auditor.acknowledged),
        **{k: soak.counts.get(k, 0) for k in _FAULT_COUNTS},
        **soak.log_counts(),
        **{f"hostile_{k}": v for k, v in sorted(hostile.sent.items())},
    }


_FAULT_COUNTS = (
    "node_kills",
    "worker_kills",
    "worker_freezes",
    "broker_kills",
    "unexpected_exits",
)


def rebuild_figures(results: list[dict[str, Any]], ends: dict[int, int]) -> dict[str, Any]:
    errors = [r["error"] for r in results if "error" in r]
    compared = [r for r in results if "error" not in r]
    for error in errors:
        print(f"rebuild: {error}")
    mismatched = [r for r in compared if not r["match"]]
    for r in mismatched:
        print(f"rebuild: node {r['node']} p{r['partition']} differs at offset {r['offset']}")
    match = bool(compared) and not errors and not mismatched
    # A digest compared at an old offset proves little: name partitions no node index reached.
    # (The end offset is past a transaction marker, so the last record is at end - 2.)
    newest = {
        p: max((r["offset"] for r in compared if r["partition"] == p), default=-1) for p in ends
    }
    behind = {p: (newest[p], end) for p, end in ends.items() if newest[p] < end - 2}
    for p, (offset, end) in sorted(behind.items()):
        print(f"rebuild: no node index of p{p} reached the log end ({offset} of {end})")
    return {
        "digest_match": str(match).lower(),
        "rebuild_compared": len(compared),
        "rebuild_mismatched": len(mismatched),
        "rebuild_errors": len(errors),
        "live_behind": len(behind),
    }


def _done_figures(auditor: Auditor, acked: set[str]) -> dict[str, Any]:
    waits = [s / 1000 for s in auditor.done_after(acked)]
    return {
        "done_p50_s": round(pct(waits, 50), 2),
        "done_p99_s": round(pct(waits, 99), 2),
        "done_max_s": round(max(waits), 2) if waits else "nan",
    }


def _print_samples(findings: Any) -> None:
    for name in ("lost", "duplicate_successes", "stale_effects", "dead_unstarted"):
        sample = [repr(item)[:80] for item in getattr(findings, name)[:5]]
        if sample:
            print(f"{name}: {len(getattr(findings, name))}, e.g. {', '.join(sample)}")


def _print_stalls(auditor: Auditor, soak: Soak) -> None:
    """One line per kill: when, what it hit, and how long it held up work."""
    for fault in soak.faults:
        at = time.strftime("%H:%M:%S", time.gmtime(fault.at_ms / 1000))
        what = sorted(fault.partitions) if fault.kind == "node" else fault.worker_id
        gap = f", {auditor.node_gap(fault)} s since the last lease" if fault.kind == "node" else ""
        print(f"stall: {fault.kind} kill at {at} UTC ({what}): {auditor.stall(fault)} s{gap}")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = p.add_argument
    add("--jobs", type=int, default=5_000)
    add("--duration-s", type=float, help="offer jobs this long instead (--jobs = rate x duration)")
    add("--rate", type=float, default=50.0, help="jobs offered per second")
    add("--nodes", type=int, default=2)
    add("--workers", type=int, default=3)
    add("--concurrency", type=int, default=20)
    add("--partitions", type=int, default=6)
    add("--max-in-flight", type=int, default=1_000, help="passed to the nodes")
    add("--max-unstarted", type=int, help="passed to the nodes (default: the node's)")
    add("--standby", action="store_true", help="nodes keep warm copies of the others' partitions")
    add("--lease-s", type=float, default=5.0, help="workers' run lease")
    add("--dispatch-timeout-s", type=float, default=5.0, help="nodes' time for a worker to start")
    add("--node-kill-every-s", type=float, default=60.0)
    add("--node-down-s", type=float, default=5.0)
    add("--worker-kill-every-s", type=float, default=10.0)
    add("--freeze-every-s", type=float, default=30.0)
    add("--freeze-s", type=float, default=12.0, help="longer than --lease-s")
    add("--broker-kill-at", type=float, default=0.5, help="share of the load; negative: never")
    add("--broker-down-s", type=float, default=10.0)
    add("--hostile-every-s", type=float, default=20.0)
    add("--hostile", type=_kinds, default=list(KINDS), help=f"comma-separated of {KINDS}")
    add("--flaky-share", type=float, default=0.1, help="jobs failing their first attempts")
    add("--broken-share", type=float, default=0.02, help="jobs failing for good")
    add("--settle-s", type=float, default=120.0, help="give up when nothing moved this long")
    add("--drain-timeout-s", type=float, default=1_800.0)
    add("--seed", type=int, default=1)
    add("--keep", action="store_true", help="keep the run directory (logs, indexes)")
    args = p.parse_args(argv)
    if args.duration_s is not None:
        args.jobs = max(1, int(args.rate * args.duration_s))
    return args


def _kinds(text: str) -> list[str]:
    kinds = [k for k in text.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown hostile kinds {sorted(unknown)}")
    return kinds


def main() -> None:
    args = parse()
    # aiokafka logs every failed connection while the broker is down: the soak counts instead.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    run_dir = Path(tempfile.mkdtemp(prefix="evsched-chaos-"))
    soak = Soak(args, run_dir)
    soak.rng.seed(args.seed)
    started = now_ms()
    try:
        soak.start_broker()
        print(f"namespace {soak.namespace} on {soak.bootstrap}, logs in {run_dir}", flush=True)
        figures = asyncio.run(soak_run(soak))
    finally:
        soak.stop()
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    figures["wall_s"] = round((now_ms() - started) / 1000, 1)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
