"""``evsched queues limit`` on the real broker: the limit is written to the queue's home first and
then to every partition, each partition's verdict is read back, and the queue's jobs then ask
for permits and run, at most the limit at once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.integration.engine import Operator, Stack
from tests.integration.stacks import node_and_worker

from evsched.adapters.kafka.partition_log import partition_for
from evsched.core.state import Status

pytestmark = [pytest.mark.broker, pytest.mark.slow]


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    async with node_and_worker(kafka_bootstrap, "oplim", tmp_path) as engine:
        yield engine


async def test_a_queue_limited_from_the_cli_runs_its_jobs_with_permits(stack: Stack) -> None:
    op = Operator(stack)
    written = await op.json("queues", "limit", "default", "--max-running", "1", "--rate", "5/1s")
    assert written[0]["partition"] == partition_for("default", 3)  # the home first
    assert sorted(p["partition"] for p in written) == [0, 1, 2]
    assert {(p["kind"], p["verdict"]) for p in written} == {("QueueLimitSet", "applied")}
    assert "limited to at most 1 running and at most 5 starts per 1000 ms" in written[0]["reading"]
    jobs = [(await op.json("enqueue", "s.noop"))[0]["id"] for _ in range(3)]
    for job_id in jobs:
        await stack.wait_status(job_id, Status.SUCCEEDED)
    kinds = [e.kind for e in await stack.timeline(jobs[0])]
    assert kinds.index("PermitRequested") < kinds.index("PermitGranted") < kinds.index("JobLeased")
    removed = await op.json("queues", "limit", "default", "--remove")
    assert "no longer limited" in removed[0]["reading"]
