"""Worker pools past the events partition count (issue 12, item 4): dispatch topics with more
partitions than the events, and a queue's dispatch topic grown while nodes and workers run.

Real node and worker processes on the real broker; each test ends with the invariant checks over
the log (``Stack.check``) and every job started exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.conftest import unique_name
from tests.integration.engine import Operator, Proc, Stack, all_succeeded, logged, wait_for

from evsched.adapters.kafka.topics import ensure_topics, partition_count
from evsched.core.events import AttemptStarted
from evsched.core.invariants import Replay
from evsched.core.state import Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(600)]
DEADLINE_S = 180.0


def starts_per_job(folded: Replay) -> Counter[str]:
    """How many AttemptStarted the fold applied, per job."""
    return Counter(
        job_id
        for job_id, timeline in folded.job_timelines.items()
        for entry in timeline
        if entry.kind == "AttemptStarted" and entry.verdict is Verdict.APPLIED
    )


async def all_ran_once(stack: Stack, jobs: Sequence[str]) -> Replay:
    """Every job succeeded, the invariants hold, and each job was started exactly once."""

    async def done() -> bool:
        return await all_succeeded(stack, jobs)

    await wait_for(done, what=f"{len(jobs)} jobs to succeed", timeout_s=DEADLINE_S)
    folded = await stack.check(all_terminal=True)
    starts = starts_per_job(folded)
    assert {starts[j] for j in jobs} == {1}, {j: starts[j] for j in jobs if starts[j] != 1}
    return folded


def worker_ids(procs: Sequence[Proc]) -> dict[str, str]:
    """Each worker process's worker id (from its ``worker_started`` line), by process name."""
    return {p.name: logged(p, "worker_started")[0]["worker_id"] for p in procs}


async def test_three_workers_take_work_from_one_events_partition(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = unique_name("wide")
    await ensure_topics(
        kafka_bootstrap, namespace, event_partitions=1, queues=["default"], dispatch_partitions=4
    )
    stack = Stack(kafka_bootstrap, namespace, tmp_path, partitions=1)
    stack.start_node("node-1")
    workers = [stack.start_worker(f"worker-{i}") for i in (1, 2, 3)]
    jobs: list[str] = []
    try:

        async def everyone_started() -> Counter[str] | None:
            # Waves of jobs until each worker has started one: the pool's group spreads the
            # four dispatch partitions over the three workers as they join.
            jobs.extend(await stack.enqueue_effects(8, f"wave{len(jobs)}"))
            events, _ = await stack.history()
            started = Counter(e.worker_id for e, _ in events if isinstance(e, AttemptStarted))
            return started if len(started) >= len(workers) else None

        await wait_for(everyone_started, what="every worker starting a job", timeout_s=DEADLINE_S)
        await all_ran_once(stack, jobs)
        events, _ = await stack.history()
        started = Counter(e.worker_id for e, _ in events if isinstance(e, AttemptStarted))
        ids = worker_ids(workers)
        assert {name: started[wid] > 0 for name, wid in ids.items()} == {
            "worker-1": True,
            "worker-2": True,
            "worker-3": True,
        }, (ids, started)
        assert set(started) == set(ids.values())
        assert await partition_count(kafka_bootstrap, stack.topics.events) == 1
    finally:
        await stack.close()


async def test_a_queue_grown_while_it_runs_loses_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = unique_name("grow")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=2, queues=["default"])
    stack = Stack(kafka_bootstrap, namespace, tmp_path, partitions=2)
    stack.start_node("node-1")
    stack.start_worker("worker-1")
    stack.start_worker("worker-2")
    topic = stack.topics.dispatch("default")
    try:
        before = await stack.enqueue_effects(20, "before")

        async def during() -> list[str]:
            jobs: list[str] = []
            for chunk in range(6):
                jobs += await stack.enqueue_effects(5, f"during{chunk}")
                await asyncio.sleep(0)
            return jobs

        enqueuing = asyncio.create_task(during())
        code, output = await Operator(stack).run("queues", "partitions", "default", "--count", "6")
        assert code == 0, output
        assert f"{topic}: 2 -> 6 partitions" in output
        in_between = await enqueuing
        assert await partition_count(kafka_bootstrap, topic) == 6
        after: list[str] = []

        async def new_partitions_used() -> bool:
            after.extend(await stack.enqueue_effects(6, f"after{len(after)}"))
            used = {r.partition for r in await stack.read_raw(topic)}
            return used >= {2, 3, 4, 5}

        await wait_for(new_partitions_used, what="dispatch records on the added partitions")
        await all_ran_once(stack, before + in_between + after)
        code, output = await Operator(stack).run("queues", "partitions", "default", "--count", "3")
        assert code == 2
        assert "cannot remove partitions" in output and "Traceback" not in output, output
    finally:
        await stack.close()
