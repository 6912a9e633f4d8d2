"""A job waiting for a worker costs nothing while it waits (no lease, no expiry) and is leased
as soon as a worker of its queue is seen (issue 32, item 3): real node and worker processes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Stack, logged, wait_for

from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.state import Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]
DISPATCH_TIMEOUT_S = 1.0


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("idle")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path)
    try:
        yield engine
    finally:
        await engine.close()


async def test_a_job_without_worker_is_not_leased_until_a_worker_of_its_queue_joins(
    stack: Stack,
) -> None:
    node = stack.start_node("node-1", "--dispatch-timeout-s", str(DISPATCH_TIMEOUT_S))

    async def running() -> bool:
        phases = logged(node, "partition_phase")
        return len({p["partition"] for p in phases if p["new"] == "running"}) == stack.partitions

    async def presence_known() -> bool:
        return bool(logged(node, "worker_presence_known"))

    # The node owns and steps every partition: from here on a lease would come at once.
    await wait_for(running, what="the node to run its partitions", timeout_s=120)
    async with stack.app() as app:
        job_id = await app.enqueue("s.noop")
        await stack.wait_status(job_id, Status.SCHEDULED)
        # The node has planned and asked the workers' groups: no worker serves `default`.
        await wait_for(presence_known, what="the node's first look-up of the worker pools")

        # Three dispatch timeouts: before, the job was leased and expired again each one.
        window_ends = time.monotonic() + 3 * DISPATCH_TIMEOUT_S
        kinds: list[str] = []
        while time.monotonic() < window_ends:
            kinds = [e.kind for e in await stack.timeline(job_id)]
            assert kinds == ["JobEnqueued"], kinds  # nothing but the enqueue, all along
            await asyncio.sleep(0.1)  # the pace of the looks, not a wait for a condition
        assert kinds == ["JobEnqueued"]
        # What the replica folded is what the log holds for the job.
        events, _ = await stack.history()
        assert [type(e).__name__ for e, _ in events if getattr(e, "job_id", None) == job_id] == [
            "JobEnqueued"
        ]

        worker = stack.start_worker("worker-1")
        await stack.wait_status(job_id, Status.SUCCEEDED, timeout_s=60)
    timeline = await stack.timeline(job_id)
    applied = [e.kind for e in timeline if e.verdict is Verdict.APPLIED]
    assert applied == ["JobEnqueued", "JobLeased", "AttemptStarted", "AttemptSucceeded"], applied
    lease = next(e for e in timeline if e.kind == "JobLeased")
    assert lease.token == 1  # the first lease it ever got
    assert not [e for e in timeline if e.kind == "LeaseExpired"]
    # Leased soon after the worker held its partitions (the node looks once a second); the
    # process's own start (imports, topic checks) is not the node's to shorten.
    [positioned] = logged(worker, "dispatch_start_positioned")
    joined_ms = datetime.fromisoformat(positioned["timestamp"]).timestamp() * 1000
    waited_s = (lease.log_at - joined_ms) / 1000
    assert waited_s < 5, f"leased {waited_s:.2f} s after the worker joined its pool"
