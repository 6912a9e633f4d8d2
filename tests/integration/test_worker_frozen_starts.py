"""Issue 32, item 3: a frozen worker starts no handler for a job cancelled, or whose lease passed,
while it was frozen (real node and worker processes on the real broker; SIGSTOP and SIGCONT).

The handler (``f.mark``) leaves ``ran-<token>`` in the test's folder: a side effect outside the log,
so "never ran" is judged from the file system, not from what the fold accepted. Every test waits
for the worker to have decided (a handler's marker, or its ``handler_not_started`` line) before it
looks, so a test fails on the old code instead of looking too early.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, logged, wait_for
from tests.integration.follow_app import make_app

from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import App
from evsched.core.state import Status, TimelineEntry, Verdict
from evsched.runtime.worker.prestart import STALL_S, TICK_S

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.asyncio]

FOLLOW_APP = "tests.integration.follow_app:app"
LEASE_S = "3"


@asynccontextmanager
async def frozen_stack(
    bootstrap: str, tmp_path: Path, *node_args: str
) -> AsyncIterator[tuple[Stack, Proc, App]]:
    """A node, one worker of the follow app that has run a job (so it holds the dispatch
    partitions), and a client app; the worker is then frozen (SIGSTOP)."""
    namespace = unique_name("frozen")
    await ensure_topics(bootstrap, namespace, event_partitions=3, queues=["default"])
    stack = Stack(bootstrap, namespace, tmp_path)
    stack.start_node("node-1", *node_args)
    worker = stack.start_worker("worker-1", "--lease-s", LEASE_S, app=FOLLOW_APP)
    app = make_app(stack.settings)
    try:
        async with app:
            warm = tmp_path / "warm"
            warm.mkdir()
            await stack.wait_status(await app.enqueue("f.mark", str(warm)), Status.SUCCEEDED)
            worker.signal(signal.SIGSTOP)
            yield stack, worker, app
    finally:
        await stack.close()


def ran(marks: Path) -> list[int]:
    """Tokens of the handler runs that left their marker."""
    return sorted(int(p.name.removeprefix("ran-")) for p in marks.glob("ran-*"))


async def until_decided(worker: Proc, marks: Path, job_id: str) -> None:
    """Until the worker ran the job's handler or logged that it did not start it."""

    def decided() -> bool:
        skipped = [e for e in logged(worker, "handler_not_started") if e.get("job_id") == job_id]
        return bool(ran(marks) or skipped)

    await wait_for(lambda: asyncio.to_thread(decided), what=f"the worker's decision on {job_id}")


async def until_in_timeline(
    stack: Stack, job_id: str, found: Callable[[TimelineEntry], bool], what: str
) -> TimelineEntry:
    async def probe() -> TimelineEntry | None:
        hits = [t for t in await stack.timeline(job_id) if found(t)]
        return hits[0] if hits else None

    return await wait_for(probe, what=what)


async def until_past_the_race(stack: Stack, job_id: str) -> None:
    """The worker stays frozen long enough for its stall watch to see it (a loop that stood still
    more than ``TICK_S + STALL_S``): a start held across a stall waits for the fold's verdict,
    where a prompt one runs at once (a cancel that fast reaches the handler through the follow).
    The lease came after the SIGSTOP, so the freeze has lasted at least this long past it."""
    lease = await until_in_timeline(
        stack, job_id, lambda t: t.kind == "JobLeased", "the job's lease"
    )

    async def past() -> bool:
        return time.time() * 1000 - lease.log_at > 2_000 * (TICK_S + STALL_S)

    await wait_for(past, what="the freeze to be one the worker's stall watch sees")


async def cancel_and_wake(stack: Stack, worker: Proc, app: App, job_id: str, marks: Path) -> None:
    """Cancel the leased ``job_id`` while its worker is frozen, wake the worker once its stall
    watch must see the freeze, and wait for its start (which the fold refuses) and decision."""
    await stack.wait_status(job_id, Status.LEASED)  # its dispatch record is out
    await app.cancel(job_id)
    await stack.wait_status(job_id, Status.CANCELLED)
    await until_past_the_race(stack, job_id)
    worker.signal(signal.SIGCONT)
    await until_in_timeline(
        stack, job_id, lambda t: t.kind == "AttemptStarted", "the woken worker's start"
    )
    await until_decided(worker, marks, job_id)


async def test_a_job_cancelled_while_its_worker_is_frozen_never_runs(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    async with frozen_stack(kafka_bootstrap, tmp_path, "--dispatch-timeout-s", "15") as (
        stack,
        worker,
        app,
    ):
        job_id = await app.enqueue("f.mark", str(marks))
        # The worker takes the dispatch (its start deadline is 15 s away) and sends its start,
        # which the fold refuses: the job was cancelled.
        await cancel_and_wake(stack, worker, app, job_id, marks)
        assert ran(marks) == [], "the handler of a cancelled job ran"
        timeline = await stack.timeline(job_id)
        assert ("AttemptStarted", Verdict.REJECTED) in [(t.kind, t.verdict) for t in timeline]
        assert not [t for t in timeline if t.kind in ("AttemptSucceeded", "AttemptFailed")]
        state = await stack.job(job_id)
        assert state is not None and state.status is Status.CANCELLED
        await stack.check()


async def test_a_pre_leased_job_cancelled_while_held_by_a_frozen_worker_never_runs(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    node_args = ("--dispatch-timeout-s", "15", "--prelease-ms", "5000")
    async with frozen_stack(kafka_bootstrap, tmp_path, *node_args) as (stack, worker, app):
        job_id = await app.get_task("f.mark").options(delay=3).enqueue(str(marks))
        # Pre-leased: the worker holds the dispatch until run_at, then sends its start (refused).
        await cancel_and_wake(stack, worker, app, job_id, marks)
        assert ran(marks) == [], "the handler of a cancelled job ran"
        state = await stack.job(job_id)
        assert state is not None and state.status is Status.CANCELLED
        await stack.check()


async def test_a_dispatch_whose_lease_passed_while_frozen_never_runs(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    async with frozen_stack(kafka_bootstrap, tmp_path, "--dispatch-timeout-s", "2") as (
        stack,
        worker,
        app,
    ):
        job_id = await app.enqueue("f.mark", str(marks))
        first = await stack.wait_status(job_id, Status.LEASED)
        # The start lease of 2 s passes unstarted: the node expires it (and leases again).
        await until_in_timeline(
            stack,
            job_id,
            lambda t: (
                t.kind == "LeaseExpired" and t.token == first.token and t.verdict is Verdict.APPLIED
            ),
            f"the expiry of token {first.token}",
        )
        worker.signal(signal.SIGCONT)
        done = await stack.wait_status(job_id, Status.SUCCEEDED)
        assert ran(marks) == [done.token], ran(marks)
        assert first.token not in ran(marks)
        await stack.check()
