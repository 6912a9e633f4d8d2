"""Results without a replica: a job handle follows its partition from its enqueue offset
(``testing.MemoryJobFeed`` over a ``MemoryLog``), folding only that job's events."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from evsched.adapters.avro import encode_event
from evsched.client import App
from evsched.client.results import FollowGap, JobHandle, terminal_state
from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    JobCancelled,
    JobEvent,
    JobLeased,
)
from evsched.errors import JobFailed, NoJobReader
from evsched.settings import Settings
from evsched.testing import FrozenClock, MemoryJobFeed, MemoryLog

NS = "unit"
EVENTS = f"{NS}.events"


def make_app() -> tuple[App, MemoryLog]:
    log = MemoryLog(clock=FrozenClock())
    app = App(
        Settings(namespace=NS),
        name="unit",
        log_factory=lambda: log,
        feed_factory=lambda: MemoryJobFeed(log, EVENTS),
    )
    return app, log


class Node:
    """Writes what a node and a worker would, straight into the log."""

    def __init__(self, log: MemoryLog, job_id: str) -> None:
        self.log, self.job_id, self.serial = log, job_id, 0

    async def write(self, kind: type[JobEvent], **fields: Any) -> None:
        self.serial += 1
        event = kind(
            event_id=f"{self.job_id}-{self.serial}",
            job_id=self.job_id,
            emitted_at=0,
            source="test",
            **fields,
        )
        await self.log.append(EVENTS, self.job_id, encode_event(event))

    async def run(self, token: int = 1, attempt: int = 1) -> None:
        await self.write(JobLeased, token=token, attempt=attempt, lease_ms=5_000)
        await self.write(AttemptStarted, token=token, worker_id="w", lease_ms=5_000)


async def test_result_returns_the_succeeded_jobs_result() -> None:
    app, log = make_app()
    add = app.task(lambda a, b: a + b, name="add")
    handle = await add.enqueue(1, 2)
    assert isinstance(handle, JobHandle) and isinstance(handle, str)
    assert (handle.enqueue_partition, handle.enqueue_offset) == (0, 0)
    waiting = asyncio.create_task(handle.result(timeout=5))
    node = Node(log, handle)
    await node.run()
    await node.write(AttemptSucceeded, token=1, result=b"3")
    assert await waiting == 3


async def test_a_dead_job_raises_with_its_error_category_and_traceback() -> None:
    app, log = make_app()
    job = await app.task(lambda: None, name="boom", max_attempts=1).enqueue()
    node = Node(log, job)
    await node.run()
    await node.write(
        AttemptFailed,
        token=1,
        error_type="KeyError",
        message="'x'",
        category="billing",
        traceback="Traceback (most recent call last): ...",
    )
    with pytest.raises(JobFailed) as caught:
        await job.result(timeout=5)
    failed = caught.value
    assert (failed.status, failed.error_type, failed.category) == ("dead", "KeyError", "billing")
    assert failed.traceback is not None and failed.traceback.startswith("Traceback")


async def test_a_cancelled_job_raises_job_failed() -> None:
    app, log = make_app()
    job = await app.task(lambda: None, name="slow").enqueue()
    await Node(log, job).write(JobCancelled, reason="no longer needed")
    with pytest.raises(JobFailed, match="is cancelled"):
        await job.result(timeout=5)


async def test_result_times_out_when_the_job_does_not_finish() -> None:
    app, _ = make_app()
    job = await app.task(lambda: None, name="never").enqueue()
    with pytest.raises(TimeoutError):
        await job.result(timeout=0.05)


async def test_a_keyed_job_and_a_job_known_by_id_are_followed_from_the_partition_start() -> None:
    app, log = make_app()
    task = app.task(lambda: None, name="keyed")
    first = await task.options(idempotency_key="k").enqueue()
    node = Node(log, first)
    await node.run()
    await node.write(AttemptSucceeded, token=1, result=b'"done"')
    again = await task.options(idempotency_key="k").enqueue()  # a duplicate, after the success
    assert again == first and again.enqueue_offset is None
    assert await again.result(timeout=5) == "done"
    assert await app.job(first).result(timeout=5) == "done"


async def test_a_follow_that_began_after_the_lease_starts_again_from_the_start() -> None:
    app, log = make_app()
    job = await app.task(lambda: None, name="gap").enqueue()
    node = Node(log, job)
    await node.run(token=1)
    late = JobHandle(job, app, partition=0, offset=2)  # past the JobLeased: a gap
    waiting = asyncio.create_task(late.result(timeout=5))
    await node.write(AttemptSucceeded, token=1, result=b"7")
    assert await waiting == 7


async def test_a_gap_from_the_start_too_is_raised() -> None:
    _, log = make_app()
    node = Node(log, "orphan")
    await node.write(AttemptSucceeded, token=3, result=b"1")
    with pytest.raises(FollowGap):
        await asyncio.wait_for(terminal_state(MemoryJobFeed(log, EVENTS), "orphan", 0, 0), 5)


def test_result_sync_from_plain_code() -> None:
    app, log = make_app()
    job = app.task(lambda: None, name="sync").enqueue_sync()

    async def finish() -> None:
        node = Node(log, job)
        await node.run()
        await node.write(AttemptSucceeded, token=1, result=b"[1]")

    asyncio.run(finish())
    try:
        assert job.result_sync(timeout=5) == [1]
    finally:
        app.close_sync()


async def test_an_app_without_a_feed_says_how_to_get_one() -> None:
    log = MemoryLog()
    app = App(Settings(namespace=NS), name="unit", log_factory=lambda: log)
    job = await app.task(lambda: None, name="nofeed").enqueue()
    with pytest.raises(NoJobReader, match="feed_factory"):
        await job.result(timeout=1)


async def test_a_rerun_handle_waits_for_the_outcome_after_its_requeue() -> None:
    app, log = make_app()
    job = await app.task(lambda: None, name="again").enqueue()
    node = Node(log, job)
    await node.run(token=1)
    await node.write(AttemptSucceeded, token=1, result=b"1")
    assert await job.result(timeout=5) == 1
    again = await app.requeue(job, rerun=True)
    waiting = asyncio.create_task(again.result(timeout=5))
    await node.run(token=2)
    await node.write(AttemptSucceeded, token=2, result=b"2")
    assert await waiting == 2
