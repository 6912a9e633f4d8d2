"""Issue 13 items 4, 5 and 10 end to end: a real node and worker process on the real broker.

Cancel reaches running code (async handlers are cancelled, sync ones see ``ctx.cancelled``) within
a second and their later writes are rejected; results come back without a replica; a succeeded
job re-runs only when asked; failures keep a category and a traceback. Judged from the log.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Stack, wait_for, wait_path
from tests.integration.follow_app import make_app

from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import App
from evsched.core.events import AttemptCheckpointed, AttemptFailed, JobCancelled, JobRequeued
from evsched.core.state import Status, Verdict
from evsched.errors import JobFailed

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

FOLLOW_APP = "tests.integration.follow_app:app"
# The bound on how soon a handler sees its cancellation, plus the log's own latency.
CANCEL_SEEN_MS = 1_000


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    namespace = unique_name("follow")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path_factory.mktemp("follow"))
    engine.start_node("node-1", "--dispatch-timeout-s", "5")
    engine._spawn("worker-1", ["worker", "--app", FOLLOW_APP, "--concurrency", "8"])
    try:
        yield engine
        await engine.check(all_terminal=False)
    finally:
        await engine.close()


def follow_app(stack: Stack) -> App:
    return make_app(stack.settings)


async def events_of(stack: Stack, job_id: str) -> list[tuple[object, int]]:
    """The job's events in log order, with their log times."""
    events, _ = await stack.history()
    return [(e, p.log_at) for e, p in events if getattr(e, "job_id", None) == job_id]


async def verdicts(stack: Stack, job_id: str) -> list[tuple[str, Verdict]]:
    return [(e.kind, e.verdict) for e in await stack.timeline(job_id)]


async def assert_cancel_reached_the_handler(stack: Stack, job_id: str, steps: int) -> None:
    """From the log: the worker's cancelled report came in and was rejected, and no checkpoint
    was written later than a second after the cancel (the handler stopped counting)."""

    async def reported() -> bool:
        return ("AttemptFailed", Verdict.REJECTED) in await verdicts(stack, job_id)

    await wait_for(reported, what="the worker's rejected report of the cancelled attempt")
    found = await events_of(stack, job_id)
    (cancel_at,) = [at for e, at in found if isinstance(e, JobCancelled)]
    checkpoints = [at for e, at in found if isinstance(e, AttemptCheckpointed)]
    assert checkpoints and len(checkpoints) < steps
    assert max(checkpoints) <= cancel_at + CANCEL_SEEN_MS, (max(checkpoints), cancel_at)
    (failed,) = [e for e, _ in found if isinstance(e, AttemptFailed)]
    assert (failed.error_type, failed.category) == ("evsched.Cancelled", "cancelled")
    late = [v for k, v in await verdicts(stack, job_id) if k == "AttemptCheckpointed"]
    assert Verdict.APPLIED in late  # the ones before the cancel


async def test_a_cancel_cancels_a_running_async_handler(stack: Stack, tmp_path: Path) -> None:
    async with follow_app(stack) as app:
        job = await app.enqueue("f.count", str(tmp_path), 200)
        await wait_path(tmp_path / "step-3", what="three steps counted")
        await app.cancel(job, reason="stop counting")
    await stack.wait_status(job, Status.CANCELLED)
    await wait_path(
        tmp_path / "cancelled-True-current-False",
        what="the handler to see its CancelledError with ctx.cancelled and not is_current()",
    )
    await assert_cancel_reached_the_handler(stack, job, 200)


async def test_a_sync_handler_sees_ctx_cancelled(stack: Stack, tmp_path: Path) -> None:
    async with follow_app(stack) as app:
        job = await app.enqueue("f.count_sync", str(tmp_path), 200)
        await wait_path(tmp_path / "step-3", what="three steps counted")
        await app.cancel(job)
    await wait_path(
        tmp_path / "saw-cancelled-current-False", what="the sync handler to poll ctx.cancelled"
    )
    await assert_cancel_reached_the_handler(stack, job, 200)


async def test_result_and_result_sync_without_a_replica(stack: Stack) -> None:
    async with follow_app(stack) as app:
        job = await app.enqueue("f.add", 2, 3)
        assert await job.result(timeout=60) == 5
        other = await app.enqueue("f.add", 40, 2)
        assert await asyncio.to_thread(other.result_sync, 60) == 42
        assert await app.job(job).result(timeout=60) == 5  # by id only: from the start


async def test_a_dead_job_raises_with_its_category_and_traceback(stack: Stack) -> None:
    async with follow_app(stack) as app:
        billing = await app.enqueue("f.billing")
        with pytest.raises(JobFailed) as caught:
            await billing.result(timeout=60)
        assert caught.value.status == "dead"
        assert caught.value.category == "billing_api"
        assert caught.value.traceback is not None
        assert "BillingDown: 503 from the billing API" in caught.value.traceback
        slow = await app.enqueue("f.slow")
        with pytest.raises(JobFailed) as timed_out:
            await slow.result(timeout=60)
        assert (timed_out.value.category, timed_out.value.error_type) == ("timeout", "TimeoutError")
        bad = await app.enqueue("f.bad_input")
        with pytest.raises(JobFailed, match="this input can never work") as permanent:
            await bad.result(timeout=60)
        assert permanent.value.category == "permanent"


async def test_a_succeeded_job_runs_again_only_when_asked(stack: Stack, tmp_path: Path) -> None:
    async with follow_app(stack) as app:
        job = await app.enqueue("f.runs", str(tmp_path))
        assert await job.result(timeout=60) == 1
        await app.requeue(job)  # a plain requeue of a succeeded job stays rejected

        async def refused() -> bool:
            return ("JobRequeued", Verdict.REJECTED) in await verdicts(stack, job)

        await wait_for(refused, what="the plain requeue to be rejected")
        again = await app.requeue(job, rerun=True, reason="run it again")
        assert await again.result(timeout=60) == 2
        state = await stack.wait_status(job, Status.SUCCEEDED)
        assert state.attempt == 1
    requeues = [e for e, _ in await events_of(stack, job) if isinstance(e, JobRequeued)]
    assert [r.rerun for r in requeues] == [False, True]
