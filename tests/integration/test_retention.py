"""Retention on the real broker: a node purges a finished job when its (short) retention ends,
`evsched audit` then says when and where it was purged and where its history is, and an
idempotency key makes a duplicate inside its window and a new run of the job id after it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.integration.engine import Operator, Stack, wait_for
from tests.integration.stacks import node_and_worker

from evsched.core.state import Status, TimelineEntry, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow]

# Processes start slowly on a loaded machine: generous, since every wait is on a condition.
DEADLINE_S = 240.0


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    async with node_and_worker(kafka_bootstrap, "ret", tmp_path, check=True) as engine:
        yield engine


async def applied(stack: Stack, job_id: str, kind: str, count: int = 1) -> list[TimelineEntry]:
    async def enough() -> list[TimelineEntry] | None:
        found = [
            e
            for e in await stack.timeline(job_id)
            if e.kind == kind and e.verdict is Verdict.APPLIED
        ]
        return found if len(found) >= count else None

    return await wait_for(enough, what=f"{count} applied {kind} of {job_id}", timeout_s=DEADLINE_S)


async def test_a_finished_job_is_purged_after_its_retention_and_audited(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.get_task("s.effect").options(retention=2).enqueue("kept for 2 s")
    succeeded = (await applied(stack, job_id, "AttemptSucceeded"))[0]

    (purge,) = await applied(stack, job_id, "JobPurged")

    assert purge.source.startswith("node-") and purge.log_at >= succeeded.log_at + 2_000
    assert await stack.job(job_id) is None
    assert [e.kind for e in await stack.timeline(job_id)] == ["JobPurged"]
    found: dict[str, object] = await Operator(stack).json("audit", job_id)
    assert found["state"] is None
    marked = found["purged"]
    assert isinstance(marked, dict) and marked["offset"] == purge.offset
    (row,) = found["events"]  # type: ignore[misc]
    reading = row["reading"]
    assert f"at p{purge.partition}@{purge.offset} by node-" in reading
    assert f"events log from partition {purge.partition} offset " in reading


async def test_a_key_is_a_duplicate_inside_its_window_and_a_new_run_after_it(
    stack: Stack,
) -> None:
    async with stack.app() as app:
        keyed = app.get_task("s.effect").options(idempotency_key="order-7", key_window=2)
        job_id = await keyed.enqueue("first")
        first = await stack.wait_status(job_id, Status.SUCCEEDED, timeout_s=DEADLINE_S)
        assert await keyed.enqueue("first") == job_id
        await wait_for(
            lambda: _last_verdict(stack, job_id, Verdict.DUPLICATE),
            what="the duplicate",
            timeout_s=DEADLINE_S,
        )
        state = await stack.job(job_id)
        assert state is not None and state.generation == 0

        async def window_over() -> bool:
            # Log time is the broker's clock, on this machine: the same as ours.
            return time.time() * 1000 >= first.updated_at + 2_000

        await wait_for(window_over, what="2 s of log time after the job ended", timeout_s=30)
        assert await keyed.enqueue("second") == job_id

    (_, rerun) = await applied(stack, job_id, "AttemptSucceeded", 2)
    state = await stack.job(job_id)
    assert state is not None and state.generation == 1 and state.status is Status.SUCCEEDED
    assert state.token > first.token and rerun.token == state.token
    assert b"second" in state.args


async def _last_verdict(stack: Stack, job_id: str, verdict: Verdict) -> bool:
    timeline = await stack.timeline(job_id)
    return bool(timeline) and timeline[-1].verdict is verdict
