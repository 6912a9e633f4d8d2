"""``evsched queues pause|resume|show`` and ``evsched schedules pause|resume`` on the real broker:
each partition's verdict is read back, and a paused queue's job waits until the resume."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.integration.engine import Operator, Stack
from tests.integration.stacks import node_and_worker

from evsched.core.state import Status

pytestmark = [pytest.mark.broker]


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    async with node_and_worker(kafka_bootstrap, "opctl", tmp_path) as engine:
        yield engine


async def test_a_queue_paused_from_the_cli_holds_its_jobs_until_resumed(stack: Stack) -> None:
    op = Operator(stack)
    paused = await op.json("queues", "pause", "default", "--reason", "deploy")
    assert sorted(p["partition"] for p in paused) == [0, 1, 2]
    assert {(p["kind"], p["verdict"]) for p in paused} == {("QueuePaused", "applied")}
    again = await op.json("queues", "pause", "default", code=5)  # already paused: refused
    assert {p["verdict"] for p in again} == {"rejected"}
    shown = await op.json("queues", "show", "default")
    assert [p["paused"] for p in shown["partitions"]] == [True, True, True]
    (written,) = await op.json("enqueue", "s.noop")
    job_id = written["id"]
    await stack.wait_status(job_id, Status.SCHEDULED)
    resumed = await op.json("queues", "resume", "default")
    assert {p["verdict"] for p in resumed} == {"applied"}
    await stack.wait_status(job_id, Status.SUCCEEDED)
    lease = next(e for e in await stack.timeline(job_id) if e.kind == "JobLeased")
    resume = next(p for p in resumed if p["partition"] == lease.partition)
    assert lease.offset > resume["offset"]  # leased only after the resume


async def test_schedules_pause_and_resume_from_the_cli(stack: Stack) -> None:
    op = Operator(stack)
    code, output = await op.run("schedules", "pause", "nope")
    assert code == 3, output  # unknown: nothing written
    await op.json("schedules", "upsert", "nightly", "0 3 * * *", "s.noop")
    (paused,) = await op.json("schedules", "pause", "nightly", "--reason", "holiday")
    assert (paused["kind"], paused["verdict"]) == ("SchedulePaused", "applied")
    assert "no slot fires until it is resumed: holiday" in paused["reading"]
    (resumed,) = await op.json("schedules", "resume", "nightly")
    assert (resumed["kind"], resumed["verdict"]) == ("ScheduleResumed", "applied")
