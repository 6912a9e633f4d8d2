"""Issue 9 A.1-A.3 and C.7 on the real broker with real node and worker processes.

A forged event beyond the fold's limits (a 70 kB id, a queue no topic can be named after, a lease
token or duration that overflows) used to halt its partition for good; now it is refused and the
partition goes on. A lease that expires before any worker started it spends no attempt.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Stack, wait_for

from evsched.adapters import avro, kafka
from evsched.adapters.topics import ensure_topics
from evsched.core.events import Event, JobEnqueued, JobLeased, ScheduleDeleted, entity_id
from evsched.core.state import Status, Verdict

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
META = {"emitted_at": 0, "source": "forger"}


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("limits")
    # One partition: every forged record sits in front of the jobs that must still run.
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=1, queues=["default"])
    home = tmp_path / "stack"
    home.mkdir()
    engine = Stack(kafka_bootstrap, namespace, home, partitions=1)
    engine.start_node("node-1", "--dispatch-timeout-s", "2")
    try:
        yield engine
    finally:
        await engine.close()


async def produce(stack: Stack, events: list[Event]) -> None:
    producer = kafka.producer(stack.settings, client_id="forger")
    await producer.start()
    try:
        for event in events:
            key = entity_id(event).encode()
            await producer.send_and_wait(stack.topics.events, avro.encode_event(event), key=key)
    finally:
        await producer.stop()


async def test_forged_events_beyond_the_limits_are_refused_and_the_partition_goes_on(
    stack: Stack,
) -> None:
    base = JobEnqueued(
        event_id="f0", job_id="forged", task="s.noop", queue="default", args=b"{}", **META
    )
    await produce(
        stack,
        [
            replace(base, event_id="f1", job_id="j" * 70_000),
            ScheduleDeleted(event_id="f2", schedule_id="s" * 70_000, **META),
            replace(base, event_id="f3", queue="bad queue!"),
            replace(base, event_id="f4", queue="q" * 300),
            replace(base, event_id="f5", run_at=2**63 - 1),
            JobLeased(
                event_id="f6", job_id="forged", token=2**63 - 1, attempt=1, lease_ms=1, **META
            ),
            JobLeased(
                event_id="f7", job_id="forged", token=9, attempt=1, lease_ms=2**63 - 1, **META
            ),
        ],
    )
    stack.start_worker("worker-1", "--lease-s", "3")
    async with stack.app() as app:
        job_id = await app.enqueue("s.noop")
        await stack.wait_status(job_id, Status.SUCCEEDED)
    replica = await stack.replica()
    index = replica.index(0)
    refused = [(e.kind, e.verdict, e.reason) for e, _ in index.refused()]
    assert refused == [
        (
            "JobEnqueued",
            Verdict.REJECTED,
            "job_id has 70000 UTF-8 bytes, above the limit of 1024",
        ),
        (
            "ScheduleDeleted",
            Verdict.REJECTED,
            "schedule_id has 70000 UTF-8 bytes, above the limit of 1024",
        ),
    ]
    reasons = [e.reason for e in replica.timeline("forged")]
    assert [r.split(" ")[0] for r in reasons] == ["queue", "queue", "run_at", "token", "lease_ms"]
    assert index.job("forged") is None  # every enqueue of it was refused
    await stack.check(all_terminal=True)


async def test_a_lease_that_expires_unstarted_spends_no_attempt(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.enqueue("s.noop")  # three attempts; no worker yet

        async def expiries() -> int | None:
            timeline = await stack.timeline(job_id)
            count = sum(e.kind == "LeaseExpired" and e.verdict is Verdict.APPLIED for e in timeline)
            return count if count >= 4 else None

        await wait_for(expiries, what="four unstarted lease expiries", timeout_s=120)
        state = await stack.job(job_id)
        assert state is not None and state.status is not Status.DEAD  # it was dead after 3
        stack.start_worker("worker-1", "--lease-s", "3")
        done = await stack.wait_status(job_id, Status.SUCCEEDED)
    assert done.attempt == 1 and done.token >= 5
    await stack.check(all_terminal=True)
