"""Priority across partitions on the real broker, judged from the log.

A backlog of low-priority jobs on every events partition, slow handlers, N nodes (one, then two)
each with a small unstarted window (``--max-unstarted``, U) and one worker with two slots; then
high-priority jobs are enqueued. By the log times of the applied events, every high job must
start before all but at most B = 2·N·U of the low jobs that had not yet been dispatched (leased)
when it was enqueued: the bound of ``docs/job-lifecycle.md`` (Priorities).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.integration.engine import Proc, Stack, wait_for
from tests.integration.priority_app import make_app

from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.events import AttemptStarted, Event, JobEnqueued, JobLeased, Position
from evsched.core.invariants import replay
from evsched.core.state import Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(400)]

PARTITIONS = 4
WINDOW = 4  # --max-unstarted: U
LOWS, HIGHS = 48, 4
HANDLER_S = 0.2


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = f"prio{os.urandom(4).hex()}"
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=PARTITIONS, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path, partitions=PARTITIONS)
    try:
        yield engine
    finally:
        await engine.close()


def start_worker(stack: Stack) -> Proc:
    return stack.start_worker(
        "worker-1", "--concurrency", "2", app="tests.integration.priority_app:app"
    )


def owned(node: Proc) -> set[int]:
    """The partitions ``node`` owns now, by its log."""
    held: set[int] = set()
    for line in node.log().splitlines():
        if '"partition_assigned"' in line or '"partition_revoked"' in line:
            record = json.loads(line)
            if record.get("event") == "partition_assigned":
                held.add(record["partition"])
            elif record.get("event") == "partition_revoked":
                held.discard(record["partition"])
    return held


def applied_times(events: list[tuple[Event, Position]]) -> dict[str, dict[str, int]]:
    """Per job: the log time of its enqueue, its first applied lease and its first applied start."""
    verdicts = {
        (entry.partition, entry.offset): entry.verdict
        for timeline in replay(events).job_timelines.values()
        for entry in timeline
    }
    times: dict[str, dict[str, int]] = {}
    for event, at in events:
        if verdicts.get((at.partition, at.offset)) is not Verdict.APPLIED:
            continue
        if isinstance(event, JobEnqueued | JobLeased | AttemptStarted):
            times.setdefault(event.job_id, {}).setdefault(type(event).__name__, at.log_at)
    return times


@pytest.mark.parametrize("nodes", [1, 2])
async def test_high_jobs_start_before_all_but_a_bounded_number_of_later_dispatched_lows(
    stack: Stack, nodes: int
) -> None:
    procs = [
        stack.start_node(
            f"node-{n}", "--max-unstarted", str(WINDOW), "--unstarted-horizon-ms", "0",
            "--dispatch-timeout-s", "120",
        )
        for n in range(1, nodes + 1)
    ]  # fmt: skip

    async def settled() -> bool:
        held = [owned(node) for node in procs]
        return all(held) and sorted(p for h in held for p in h) == list(range(PARTITIONS))

    # The bound is for N nodes that own their partitions throughout: a take-over has its own.
    await wait_for(settled, what="every node to own partitions")
    worker = start_worker(stack)
    async with make_app(stack.settings) as app:
        slow = app.get_task("p.slow")
        lows = [await slow.options(priority=0).enqueue(HANDLER_S) for _ in range(LOWS)]
        partitions = {handle.enqueue_partition for handle in lows}
        assert len(partitions) == PARTITIONS, partitions  # a backlog on every partition

        async def backlog_started() -> bool:
            states = [await stack.job(job) for job in lows]
            return sum(s is not None and s.status is not Status.SCHEDULED for s in states) >= 6

        await wait_for(backlog_started, what="the backlog to be running", timeout_s=120)
        highs = [await slow.options(priority=10).enqueue(HANDLER_S) for _ in range(HIGHS)]
    for job in [*highs, *lows]:
        await stack.wait_status(job, Status.SUCCEEDED, timeout_s=240)
    assert worker.popen.poll() is None, worker.log()

    events, _ = await stack.history()
    times = applied_times(events)
    report = []
    for high in highs:
        enqueued = times[high]["JobEnqueued"]
        started = times[high]["AttemptStarted"]
        overtook = [
            low
            for low in lows
            if times[low]["JobLeased"] > enqueued and times[low]["AttemptStarted"] < started
        ]
        later = [low for low in lows if times[low]["JobLeased"] > enqueued]
        # The lease's and the start's delay after the enqueue (ms): which side held the job.
        leased_ms, started_ms = times[high]["JobLeased"] - enqueued, started - enqueued
        report.append((high, len(overtook), len(later), leased_ms, started_ms))
        assert later, "the backlog was gone before the high jobs came: nothing was judged"
    columns = "high job, lows leased after its enqueue that started first, such lows"
    print(f"{columns}, ms to lease, ms to start", report)
    assert all(overtook <= 2 * nodes * WINDOW for _, overtook, *_ in report), report
