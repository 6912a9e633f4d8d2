"""Nodes under crashes and rebalances, with real processes: nothing lost, nothing committed twice,
the index equal to a rebuild from the log, cron slots fired exactly once."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, logged, wait_for

from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.events import JobEnqueued, ScheduleFired
from evsched.core.state import TERMINAL_STATUSES, Status, Verdict

pytestmark = pytest.mark.broker


# The opt-out's variants are slow: `-m "not slow"` runs each scenario once, in the default mode.
@pytest.fixture(params=["tick", pytest.param("partition", marks=pytest.mark.slow)])
def transactions(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The nodes' transactions (EVSCHED_NODE_TRANSACTIONS): one transaction per node tick (the
    default), or a producer per partition; every node the test starts runs in it."""
    mode: str = request.param
    monkeypatch.setenv("EVSCHED_NODE_TRANSACTIONS", mode)
    return mode


async def _runs_in(proc: Proc, mode: str) -> bool:
    """Whether ``proc`` started its transactions in ``mode`` (waits for it to have started)."""

    async def started() -> list[str]:
        return [line["transactions"] for line in logged(proc, "node_started")]

    return await wait_for(started, what=f"{proc.name} to start") == [mode]


@pytest.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("nodes")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path)
    try:
        yield engine
    finally:
        await engine.close()


async def all_terminal(stack: Stack, job_ids: list[str]) -> bool:
    for job_id in job_ids:
        state = await stack.job(job_id)
        if state is None or state.status not in TERMINAL_STATUSES:
            return False
    return True


async def succeeded_count(stack: Stack, job_ids: list[str]) -> int:
    states = [await stack.job(j) for j in job_ids]
    return sum(1 for s in states if s is not None and s.status is Status.SUCCEEDED)


def succeeded_at_least(
    stack: Stack, job_ids: list[str], minimum: int
) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return await succeeded_count(stack, job_ids) >= minimum

    return probe


async def test_node_sigkill_and_restart_loses_nothing_and_matches_a_rebuild(
    stack: Stack, tmp_path: Path, transactions: str
) -> None:
    node = stack.start_node("node-1", "--dispatch-timeout-s", "3")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    jobs = await stack.enqueue_effects(150, "crash")
    await wait_for(succeeded_at_least(stack, jobs, 20), what="some jobs to finish")
    assert await _runs_in(node, transactions)
    node.kill()
    more = await stack.enqueue_effects(50, "while-down")  # acknowledged while no node runs
    restarted = stack.start_node("node-1", "--dispatch-timeout-s", "3")
    await wait_for(lambda: all_terminal(stack, jobs + more), what="every job to finish")
    assert await succeeded_count(stack, jobs + more) == 200
    # The workers' successes are in the log before the node folds them: its effects, once it has.
    await stack.check()
    assert restarted.stop() == 0

    # I4: each partition's live index equals a fresh fold of the log up to the same offset, as
    # `evsched rebuild --verify` makes and compares it.
    applied = {}
    for partition in range(stack.partitions):
        live = PartitionIndex(stack.node_data("node-1") / f"p{partition:04d}", partition)
        applied[partition] = live.applied_offset()
        live.close()
    code, document = await stack.rebuild_verify("node-1", tmp_path / "rebuild")
    assert code == 0 and document["digest_match"] is True, document
    rows = {row["partition"]: row for row in document["partitions"]}
    for partition, offset in applied.items():
        assert rows[partition]["compared"] and rows[partition]["problem"] is None
        assert rows[partition]["applied_offset"] == offset == rows[partition]["live_applied_offset"]
    await stack.check()


async def test_two_nodes_and_rebalances_mid_load_never_commit_twice(
    stack: Stack, transactions: str
) -> None:
    first = stack.start_node("node-1", "--dispatch-timeout-s", "3")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    jobs = await stack.enqueue_effects(120, "a")
    second = stack.start_node("node-2", "--dispatch-timeout-s", "3")
    await wait_for(lambda: _logged(second, "partition_assigned"), what="node-2 to own partitions")
    assert await _runs_in(first, transactions) and await _runs_in(second, transactions)
    jobs += await stack.enqueue_effects(120, "b")
    await wait_for(succeeded_at_least(stack, jobs, 150), what="most jobs to finish")
    first.stop()  # rebalance again: node-2 takes everything
    jobs += await stack.enqueue_effects(60, "c")
    await wait_for(lambda: all_terminal(stack, jobs), what="every job to finish")
    assert await succeeded_count(stack, jobs) == len(jobs)
    folded = await stack.check()
    successes = Counter(
        job_id
        for job_id, timeline in folded.job_timelines.items()
        for entry in timeline
        if entry.kind == "AttemptSucceeded" and entry.verdict is Verdict.APPLIED
    )
    assert set(successes.values()) == {1}


async def _logged(proc: Proc, event: str) -> bool:
    return f'"event": "{event}"' in proc.log()


async def test_cron_with_two_nodes_fires_each_slot_exactly_once(
    stack: Stack, transactions: str
) -> None:
    first = stack.start_node("node-1")
    second = stack.start_node("node-2")
    stack.start_worker("worker-1", "--lease-s", "3")
    for node in (first, second):
        await wait_for(lambda n=node: _logged(n, "partition_assigned"), what=f"{node.name} to join")
        assert await _runs_in(node, transactions)
    async with stack.app() as app:
        await app.upsert_schedule("every-2s", "* * * * * */2", "UTC", "s.noop")

    async def fired(minimum: int) -> list[ScheduleFired] | None:
        events, _ = await stack.history()
        applied = [e for e, _ in events if isinstance(e, ScheduleFired)]
        return applied if len({e.fire_at for e in applied}) >= minimum else None

    await wait_for(lambda: fired(2), what="two slots to fire", timeout_s=30)
    second.kill()  # the schedule's owner may change mid-way
    await wait_for(lambda: fired(5), what="five slots to fire", timeout_s=40)
    async with stack.app() as app:
        await app.delete_schedule("every-2s")

    replica = await stack.replica()

    async def deleted() -> bool:
        return any(e.kind == "ScheduleDeleted" for e in replica.timeline("every-2s"))

    await wait_for(deleted, what="the schedule's deletion to be folded")
    events, _ = await stack.history()
    cron_jobs = [e for e, _ in events if isinstance(e, JobEnqueued) and e.schedule_id]
    # Two nodes may both propose a slot; the id derived from the slot makes them one job.
    assert len({e.job_id for e in cron_jobs}) == len({e.fire_at for e in cron_jobs})
    applied_fires = Counter(
        entry.offset
        for entry in replica.timeline("every-2s")
        if entry.kind == "ScheduleFired" and entry.verdict is Verdict.APPLIED
    )
    slots = {e.fire_at for e, _ in events if isinstance(e, ScheduleFired)}
    assert len(applied_fires) == len(slots) >= 5
    fired_jobs = sorted({e.job_id for e in cron_jobs})
    await wait_for(lambda: all_terminal(stack, fired_jobs), what="every fired job to finish")
    await stack.check()


async def test_a_frozen_node_comes_back_as_a_zombie_and_commits_nothing_twice(
    stack: Stack, transactions: str
) -> None:
    zombie = stack.start_node("node-1", "--dispatch-timeout-s", "5")
    await wait_for(lambda: _logged(zombie, "partition_assigned"), what="node-1 to own partitions")
    assert await _runs_in(zombie, transactions)
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    jobs = await stack.enqueue_effects(100, "before")
    zombie.signal(signal.SIGSTOP)  # frozen mid-load, past the group's session timeout
    heir = stack.start_node("node-2", "--dispatch-timeout-s", "5")
    await wait_for(lambda: _logged(heir, "partition_assigned"), what="node-2 to take over")
    jobs += await stack.enqueue_effects(100, "during")
    zombie.signal(signal.SIGCONT)  # its open transactions are fenced; then it rejoins
    jobs += await stack.enqueue_effects(100, "after")
    await wait_for(lambda: all_terminal(stack, jobs), what="every job to finish")
    assert await succeeded_count(stack, jobs) == len(jobs)
    assert zombie.popen.poll() is None and heir.popen.poll() is None  # both lived through it
    await stack.check()


# A node asked to stop leaves within this; a stuck one is found by the test, not its teardown.
STOP_BOUND_S = 20.0


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_tick_mode_nodes_exit_on_sigterm_mid_load_and_mid_rebalance(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # librdkafka's group callbacks wait for the event loop inside a fetch; confluent-kafka lets
    # one caller at a time into the consumer. A node that called it from the loop meanwhile
    # stalled the rebalance and ignored SIGTERM (rdkafka_thread).
    monkeypatch.setenv("EVSCHED_NODE_TRANSACTIONS", "tick")
    first = stack.start_node("node-1", "--dispatch-timeout-s", "3")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    # Starting processes on a loaded machine takes long; the stops are what is bounded here.
    await wait_for(lambda: _logged(first, "partition_assigned"), what="node-1", timeout_s=180)
    jobs = await stack.enqueue_effects(150, "a")
    await wait_for(succeeded_at_least(stack, jobs, 20), what="jobs to run", timeout_s=120)
    second = stack.start_node("node-2", "--dispatch-timeout-s", "3")
    jobs += await stack.enqueue_effects(150, "b")  # the group rebalances meanwhile
    await wait_for(lambda: _logged(second, "partition_assigned"), what="node-2", timeout_s=180)
    assert [line["transactions"] for line in logged(first, "node_started")] == ["tick"]
    jobs += await stack.enqueue_effects(100, "c")
    assert await asyncio.to_thread(_exits, first) == 0  # node-2 takes everything, under load
    await wait_for(lambda: all_terminal(stack, jobs), what="every job to finish")
    assert await succeeded_count(stack, jobs) == len(jobs)
    # While a node runs: the last successes' effects are published once it has folded them.
    await stack.check()
    assert await asyncio.to_thread(_exits, second) == 0
    assert logged(second, "node_stopped")  # it closed, not killed


def _exits(proc: Proc) -> int | None:
    """SIGTERM, then the exit code within STOP_BOUND_S (None: still running, then killed)."""
    proc.signal(signal.SIGTERM)
    try:
        return proc.popen.wait(timeout=STOP_BOUND_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None
