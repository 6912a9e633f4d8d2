"""A reused job id's earlier runs leave the index after their retention, on the real broker,
while the id lives on (issue 32): its current run stays, the API pages what is left, `evsched
audit` refolds the kept runs without drift, the log still holds every run, and a rebuild of the
node's index from the log gives the same digest."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.integration.engine import Operator, Proc, Stack, node_and_worker, wait_for
from tests.integration.test_retention_orphans import key_on

from evsched.adapters.archive.history_file import read_history
from evsched.core.state import Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(900)]

# Processes start slowly on a loaded machine: generous, since every wait is on a condition.
DEADLINE_S = 600.0
RUNS = 4
RETENTION_S = 3
HOUR_S = 3_600


@pytest_asyncio.fixture
async def engine(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[tuple[Stack, Proc]]:
    async with node_and_worker(kafka_bootstrap, tmp_path, "runs") as running:
        yield running


async def test_a_reused_ids_earlier_runs_leave_the_index_after_their_retention(
    engine: tuple[Stack, Proc], tmp_path: Path
) -> None:
    stack, node = engine
    async with stack.app() as app:
        # A keyed job whose key window is 0: each enqueue after a cancel is a new run of the id.
        # Each run waits an hour and is cancelled at once, so the id is finished only for the
        # moment between a cancel and the next enqueue: far below its retention, never purged.
        keyed = app.get_task("s.effect").options(
            idempotency_key="reused", key_window=0, retention=RETENTION_S, delay=HOUR_S
        )
        job_id = ""
        for run in range(RUNS):
            job_id = await keyed.enqueue(f"run {run}")
            if run < RUNS - 1:
                await app.cancel(job_id, reason=f"run {run} done")
        ended_at = time.time() * 1000

    async def runs_folded() -> bool:
        state = await stack.job(job_id)
        return state is not None and state.generation == RUNS - 1

    await wait_for(runs_folded, what=f"{RUNS} runs of {job_id}", timeout_s=DEADLINE_S)
    before = await stack.timeline(job_id)
    assert [e.kind for e in before].count("JobEnqueued") == RUNS  # every run, within retention

    async def retention_over() -> bool:
        # Log time is the broker's clock, on this machine: the same as ours.
        return time.time() * 1000 >= ended_at + RETENTION_S * 1_000

    await wait_for(retention_over, what="the earlier runs' retention", timeout_s=30)
    # Runs leave at the partition's first event from then on: a job of the same partition.
    partition = (await stack.replica()).partition_of(job_id)
    async with stack.app() as app:
        trigger_key = key_on(partition, stack.partitions)
        trigger = await app.get_task("s.effect").options(idempotency_key=trigger_key).enqueue("t")

    async def earlier_runs_gone() -> bool:
        return len(await stack.timeline(trigger)) > 0 and [
            e.kind for e in await stack.timeline(job_id)
        ] == ["JobEnqueued"]

    await wait_for(earlier_runs_gone, what="the earlier runs to leave", timeout_s=DEADLINE_S)
    (kept,) = await stack.timeline(job_id)
    assert kept.verdict is Verdict.APPLIED and kept.offset == before[-1].offset
    state = await stack.job(job_id)
    assert state is not None and state.status is Status.SCHEDULED
    assert state.generation == RUNS - 1 and b"run 3" in state.args

    found = await Operator(stack).json("audit", job_id)
    assert found["drifted_offsets"] == [] and len(found["events"]) == 1
    assert found["state"]["generation"] == RUNS - 1

    # The log keeps every run: an export of the partition reads them all.
    exported = tmp_path / "partition.avro"
    code, output = await Operator(stack).run(
        "export", "--partition", str(partition), "-o", str(exported)
    )
    assert code == 0, output
    logged = [e for e in read_history(exported).events if e.key == job_id.encode()]
    assert [e.kind for e in logged].count("JobEnqueued") == RUNS

    await stack.wait_node_past(partition, (await stack.timeline(trigger))[-1].offset)
    assert node.stop() == 0
    code, document = await stack.rebuild_verify("node-1", tmp_path / "rebuilt")
    assert code == 0 and document["digest_match"] is True, document
