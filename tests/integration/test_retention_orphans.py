"""Rejected events of jobs the index does not hold expire (fold version 6), on the real broker: a
late completion after its job's purge is audited as rejected, then leaves the index with the
purge's mark, while a forged event for an id never enqueued stays; a rebuild equals the index."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.integration.engine import Operator, Proc, Stack, node_and_worker, wait_for

from evsched.adapters import avro
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.partition_log import partition_for
from evsched.core.events import AttemptSucceeded, JobCancelled
from evsched.core.ids import job_id_for_key
from evsched.core.state import Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(900)]

# Processes start slowly on a loaded machine: generous, since every wait is on a condition.
DEADLINE_S = 600.0


@pytest_asyncio.fixture
async def engine(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[tuple[Stack, Proc]]:
    async with node_and_worker(kafka_bootstrap, tmp_path, "orphan") as running:
        yield running


async def produce(stack: Stack, *events: AttemptSucceeded | JobCancelled) -> None:
    """Write ``events`` as a foreign producer would: a zombie worker, a forger."""
    producer = kafka.producer(stack.settings, client_id="orphans-test")
    await producer.start()
    try:
        for event in events:
            value, key = avro.encode_event(event), event.job_id.encode()
            await producer.send_and_wait(stack.topics.events, value, key=key)
    finally:
        await producer.stop()


async def purged(stack: Stack, job_id: str) -> None:
    async def applied() -> bool:
        timeline = await stack.timeline(job_id)
        return any(e.kind == "JobPurged" and e.verdict is Verdict.APPLIED for e in timeline)

    await wait_for(applied, what=f"the purge of {job_id}", timeout_s=DEADLINE_S)


def key_on(partition: int, partitions: int) -> str:
    """An idempotency key whose job id lands on ``partition``."""
    n = 0
    while partition_for(job_id_for_key("default", f"trigger-{n}"), partitions) != partition:
        n += 1
    return f"trigger-{n}"


async def test_a_late_completion_after_a_purge_is_audited_then_leaves_the_index(
    engine: tuple[Stack, Proc], tmp_path: Path
) -> None:
    stack, node = engine
    async with stack.app() as app:
        job_id = await app.get_task("s.effect").options(retention=1).enqueue("kept for 1 s")
    # Its success may be purged before the replica reads it: only the purge is waited for.
    await purged(stack, job_id)
    late = AttemptSucceeded(
        event_id="late-1", job_id=job_id, emitted_at=0, source="worker-zombie", token=1,
        result=b"null",
    )  # fmt: skip
    ghost = JobCancelled(event_id="ghost-1", job_id="ghost-1", emitted_at=0, source="forger")
    await produce(stack, late, ghost)

    async def late_folded() -> bool:
        return [(e.kind, e.verdict) for e in await stack.timeline(job_id)] == [
            ("JobPurged", Verdict.APPLIED),
            ("AttemptSucceeded", Verdict.REJECTED),
        ]

    await wait_for(late_folded, what="the late completion, rejected", timeout_s=DEADLINE_S)
    found = await Operator(stack).json("audit", job_id)
    row = found["events"][-1]
    assert row["verdict"] == "rejected" and "no such job" in row["reading"]
    assert "events log" in row["reading"]

    # The purge mark (1 s) expires at the partition's next purge: a job of the same partition.
    partition = (await stack.replica()).partition_of(job_id)
    async with stack.app() as app:
        key = key_on(partition, stack.partitions)
        trigger = (
            await app.get_task("s.effect")
            .options(idempotency_key=key, retention=1)
            .enqueue("trigger")
        )
    await purged(stack, trigger)

    async def gone() -> bool:
        return await stack.timeline(job_id) == []

    await wait_for(gone, what="the mark and the late completion to expire", timeout_s=DEADLINE_S)
    code, output = await Operator(stack).run("audit", job_id)
    assert code == 3 and "no events of" in output and "events log" in output
    assert [e.kind for e in await stack.timeline("ghost-1")] == ["JobCancelled"]  # kept 7 days

    await stack.wait_node_past(partition, (await stack.timeline(trigger))[-1].offset)
    assert node.stop() == 0
    code, document = await stack.rebuild_verify("node-1", tmp_path / "rebuilt")
    assert code == 0 and document["digest_match"] is True, document
    await stack.check(all_terminal=True)
