"""Global concurrency limits on the real broker: two nodes, four partitions, real workers, judged
from the whole log: never more than ``max_running`` of the queue's attempts held a lease at once,
also while a node is SIGKILLed mid-run and its partitions (a home among them) move."""

from __future__ import annotations

import json
import os

import pytest
from tests.integration.engine import Proc, Stack, wait_for
from tests.integration.limits_app import LIMITED, make_app

from evsched.adapters.kafka.partition_log import partition_for
from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.events import AttemptStarted, Event, Position, QueuePermit
from evsched.core.invariants import Replay, replay
from evsched.core.state import ACTIVE_STATUSES, Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.asyncio(loop_scope="function")]
LIMIT = 2
JOBS = 14


def held_at_once(done: Replay, jobs: set[str] | None = None) -> int:
    """The most attempts holding a lease at one log time: a lease is held from its applied
    JobLeased until the applied event that leaves leased/running; an end and a start at the
    same millisecond count as end first (a release precedes the grant it makes room for)."""
    marks: list[tuple[int, int]] = []
    for job_id, timeline in done.job_timelines.items():
        if jobs is not None and job_id not in jobs:
            continue
        holding = False
        for entry in timeline:
            if entry.verdict is not Verdict.APPLIED:
                continue
            active = entry.status_after in ACTIVE_STATUSES
            if active and not holding:
                marks.append((entry.log_at, 1))
            elif holding and not active:
                marks.append((entry.log_at, -1))
            holding = active
    most = now = 0
    for _, step in sorted(marks):
        now += step
        most = max(most, now)
    return most


async def _run(stack: Stack, *, kill_midway: bool) -> tuple[list[tuple[Event, Position]], Replay]:
    nodes = [stack.start_node("node-1"), stack.start_node("node-2")]
    for name in ("worker-1", "worker-2"):
        stack._spawn(name, ["worker", "--app", "tests.integration.limits_app:app"])
    async with make_app(stack.settings) as app:
        await app.limit_queue(LIMITED, max_running=LIMIT)
        task = app.get_task("l.sleep")
        ids = [await task.enqueue(400) for _ in range(JOBS)]
        if kill_midway:
            await _succeeded(stack, ids, at_least=3)
            home = partition_for(LIMITED, stack.partitions)

            async def owner() -> Proc | None:  # none while a rebalance moves the partition
                return _owner(nodes, home)

            victim = await wait_for(owner, what=f"a node holding the home partition {home}")
            victim.kill()  # the home of the limit moves to the other node
        await _succeeded(stack, ids, at_least=JOBS, timeout_s=180)
    events, _ = await stack.history()
    return events, replay(events)


def _owner(nodes: list[Proc], partition: int) -> Proc | None:
    """The node whose log says it holds ``partition`` now (assigned, not revoked since)."""
    for proc in nodes:
        held = False
        for line in proc.log().splitlines():
            if not line.startswith("{"):
                continue
            record = json.loads(line)
            if record.get("partition") == partition:
                held = record.get("event") == "partition_assigned" or (
                    held and record.get("event") != "partition_revoked"
                )
        if held:
            return proc
    return None


async def _succeeded(stack: Stack, ids: list[str], *, at_least: int, timeout_s: float = 90) -> None:
    async def enough() -> bool | None:
        _, done = None, replay((await stack.history())[0])
        ok = [j for j in ids if (s := done.jobs.get(j)) and s.status is Status.SUCCEEDED]
        return True if len(ok) >= at_least else None

    await wait_for(enough, what=f"{at_least} jobs succeeded", timeout_s=timeout_s)


async def _stack(kafka_bootstrap: str, tmp: pytest.TempPathFactory, name: str) -> Stack:
    namespace = f"lim{os.urandom(4).hex()}"
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=4, queues=[LIMITED])
    return Stack(kafka_bootstrap, namespace, tmp.mktemp(name), partitions=4)


async def test_never_more_than_max_running_hold_a_lease(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    stack = await _stack(kafka_bootstrap, tmp_path_factory, "limits")
    try:
        events, done = await _run(stack, kill_midway=False)
    finally:
        await stack.close()
    assert done.violations == []
    assert held_at_once(done) == LIMIT  # the bound holds, and is reached
    kinds = {type(e).__name__ for e, _ in events}
    assert {"PermitRequested", "QueuePermit", "PermitGranted"} <= kinds
    refused = [e for t in done.job_timelines.values() for e in t if e.verdict is Verdict.REJECTED]
    assert refused == []  # one owner per partition: no proposal of its was refused


async def test_the_bound_holds_when_a_node_is_killed_mid_run(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    stack = await _stack(kafka_bootstrap, tmp_path_factory, "limits-kill")
    try:
        _, done = await _run(stack, kill_midway=True)
    finally:
        await stack.close()
    assert done.violations == []
    assert held_at_once(done) <= LIMIT
    statuses = {s.status for s in done.jobs.values()}
    assert statuses == {Status.SUCCEEDED}


RATE, PER_MS = 3, 2_000


async def test_a_rate_limit_grants_at_most_n_per_window_of_log_time(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    stack = await _stack(kafka_bootstrap, tmp_path_factory, "limits-rate")
    try:
        stack.start_node("node-1")
        stack.start_node("node-2")
        stack._spawn("worker-1", ["worker", "--app", "tests.integration.limits_app:app"])
        async with make_app(stack.settings) as app:
            await app.limit_queue(LIMITED, rate=(RATE, PER_MS))
            task = app.get_task("l.sleep")
            ids = [await task.enqueue(10) for _ in range(9)]
            await _succeeded(stack, ids, at_least=len(ids), timeout_s=120)
        events, _ = await stack.history()
    finally:
        await stack.close()
    done = replay(events)
    assert done.violations == []
    verdicts = {(e.partition, e.offset): e.verdict for t in done.job_timelines.values() for e in t}
    grants = sorted(
        p.log_at
        for e, p in events
        if isinstance(e, QueuePermit) and e.action == "grant"
        and _home_verdict(done, p) is Verdict.APPLIED
    )  # fmt: skip
    assert len(grants) == 9
    for i in range(len(grants) - RATE):
        assert grants[i + RATE] - grants[i] >= PER_MS, grants  # N per window, measured
    starts = sorted(
        p.log_at
        for e, p in events
        if isinstance(e, AttemptStarted) and verdicts[p.partition, p.offset] is Verdict.APPLIED
    )
    assert len(starts) == 9
    # The starts were spread: none before its grant, so the last one comes at least two
    # windows after the first grant (a start's delay after its grant varies with the load).
    assert starts[-1] - grants[0] >= (9 // RATE - 1) * PER_MS, (grants, starts)


def _home_verdict(done: Replay, position: Position) -> Verdict | None:
    """The verdict the home's fold gave the QueuePermit at ``position`` (not in job timelines)."""
    return done.limit_verdicts.get((position.partition, position.offset))


async def test_a_key_limit_holds_across_partitions(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    stack = await _stack(kafka_bootstrap, tmp_path_factory, "limits-key")
    try:
        stack.start_node("node-1")
        stack.start_node("node-2")
        stack._spawn("worker-1", ["worker", "--app", "tests.integration.limits_app:app"])
        async with make_app(stack.settings) as app:
            await app.limit_key("customer-42", max_running=1)
            task = app.get_task("l.sleep")
            keyed = [
                await task.options(concurrency_key="customer-42").enqueue(300) for _ in range(6)
            ]
            free = [await task.enqueue(300) for _ in range(6)]
            await _succeeded(stack, keyed + free, at_least=12, timeout_s=120)
        events, _ = await stack.history()
    finally:
        await stack.close()
    done = replay(events)
    assert done.violations == []
    assert held_at_once(done, set(keyed)) == 1
    assert held_at_once(done, set(free)) > 1  # jobs without the key are not held back
