"""Cancel that reaches running code: a worker follows each attempt's job from its lease
(``testing.MemoryJobFeed``), and failures carry their category and traceback."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from evsched.adapters.avro import encode_event
from evsched.client.context import Context
from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptStarted,
    AttemptSucceeded,
    JobCancelled,
    JobLeased,
    LeaseExpired,
)
from evsched.testing import MemoryJobFeed
from tests.unit.worker_rig import EVENTS, Rig, make_rig, until

DEADLINE_S = 10.0


async def lease(rig: Rig, task: str, *args: Any, **fields: Any) -> Dispatch:
    """Write the JobLeased a node would, then its dispatch (following from the lease)."""
    dispatch = rig.dispatch(task, *args, events_offset=len(rig.log.records), **fields)
    leased = JobLeased(
        event_id=f"lease-{dispatch.job_id}",
        job_id=dispatch.job_id,
        emitted_at=0,
        source="node-test",
        token=dispatch.token,
        attempt=dispatch.attempt,
        lease_ms=dispatch.lease_ms,
    )
    await rig.log.append(EVENTS, dispatch.job_id, encode_event(leased))
    rig.feed.put_dispatch(dispatch)
    return dispatch


async def cancel(rig: Rig, job_id: str) -> float:
    started = rig.events_of(job_id, AttemptStarted)
    assert started, "cancel only after the attempt started"
    event = JobCancelled(event_id=f"cancel-{job_id}", job_id=job_id, emitted_at=0, source="test")
    await rig.log.append(EVENTS, job_id, encode_event(event))
    return time.monotonic()


async def started(rig: Rig, job_id: str) -> None:
    await until(lambda: bool(rig.events_of(job_id, AttemptStarted)), "the start", DEADLINE_S)


async def test_a_cancel_in_the_log_cancels_a_running_async_handler_within_a_second() -> None:
    rig = make_rig()
    seen: list[str] = []

    @rig.app.task(name="forever")
    async def forever(ctx: Context) -> None:
        assert await ctx.is_current()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen.append(f"cancelled={ctx.cancelled} current={await ctx.is_current()}")
            raise

    async with rig.worker(follow=MemoryJobFeed(rig.log, EVENTS)):
        dispatch = await lease(rig, "forever")
        await started(rig, dispatch.job_id)
        cancelled_at = await cancel(rig, dispatch.job_id)
        failed = await rig.outcome(dispatch.job_id, timeout_s=DEADLINE_S)
        assert time.monotonic() - cancelled_at < 1.0
    assert seen == ["cancelled=True current=False"]
    assert (failed.error_type, failed.category) == ("evsched.Cancelled", "cancelled")
    assert "the job was cancelled" in failed.message


async def test_a_sync_handler_polls_ctx_cancelled_and_its_later_writes_still_go_out() -> None:
    rig = make_rig()
    polled = threading.Event()

    @rig.app.task(name="steps")
    def steps(ctx: Context) -> int:
        for step in range(2_000):
            if ctx.cancelled:
                polled.set()
                assert not ctx.is_current_sync()
                ctx.checkpoint_sync({"step": step})  # the fold rejects it: not current
                return step
            time.sleep(0.005)
        return -1

    async with rig.worker(follow=MemoryJobFeed(rig.log, EVENTS)):
        dispatch = await lease(rig, "steps")
        await started(rig, dispatch.job_id)
        await cancel(rig, dispatch.job_id)
        failed = await rig.outcome(dispatch.job_id, timeout_s=DEADLINE_S)
    assert polled.is_set()
    assert rig.events_of(dispatch.job_id, AttemptCheckpointed)
    assert failed.category == "cancelled"


async def test_a_worker_without_a_follow_keeps_ctx_current_and_not_cancelled() -> None:
    rig = make_rig()
    answers: list[tuple[bool, bool]] = []

    @rig.app.task(name="quick")
    async def quick(ctx: Context) -> int:
        answers.append((ctx.cancelled, await ctx.is_current()))
        return 1

    async with rig.worker():
        dispatch = rig.send("quick")
        await rig.outcome(dispatch.job_id, timeout_s=DEADLINE_S)
    assert answers == [(False, True)]


async def test_a_dispatch_from_an_older_node_is_not_followed() -> None:
    rig = make_rig()
    answers: list[bool] = []

    @rig.app.task(name="old")
    async def old(ctx: Context) -> None:
        answers.append(await ctx.is_current())

    feed = MemoryJobFeed(rig.log, EVENTS)
    async with rig.worker(follow=feed):
        dispatch = rig.send("old")  # events_offset None
        await rig.outcome(dispatch.job_id, timeout_s=DEADLINE_S)
    assert answers == [True] and feed.following == 0


class BillingDown(Exception):
    pass


async def test_failures_carry_their_category_and_a_bounded_traceback() -> None:
    rig = make_rig()

    @rig.app.task(name="billing", categories={BillingDown: "billing_api"})
    def billing() -> None:
        raise BillingDown("503 from billing")

    @rig.app.task(name="plain")
    def plain() -> None:
        raise ValueError("bad input")

    @rig.app.task(name="slow", timeout_s=0.05)
    async def slow() -> None:
        await asyncio.sleep(5)

    async with rig.worker():
        outcomes = {}
        for task in ("billing", "plain", "slow"):
            dispatch = rig.send(task)
            outcomes[task] = await rig.outcome(dispatch.job_id, timeout_s=DEADLINE_S)
    billing_failed = outcomes["billing"]
    assert billing_failed.category == "billing_api"
    assert "BillingDown: 503 from billing" in billing_failed.traceback
    assert outcomes["plain"].category == "transient"
    assert outcomes["plain"].traceback.rstrip().endswith("ValueError: bad input")
    assert (outcomes["slow"].category, outcomes["slow"].traceback) == ("timeout", None)


async def test_a_lost_lease_ends_is_current_but_lets_the_handler_finish() -> None:
    rig = make_rig()
    seen: list[tuple[bool, bool]] = []

    @rig.app.task(name="zombie")
    def zombie(ctx: Context) -> str:
        deadline = time.monotonic() + DEADLINE_S
        while ctx.is_current_sync() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append((ctx.is_current_sync(), ctx.cancelled))
        return "late"

    async with rig.worker(follow=MemoryJobFeed(rig.log, EVENTS)):
        dispatch = await lease(rig, "zombie")
        await started(rig, dispatch.job_id)
        rig.log.log_at = 10**9  # far past the run lease: the node's expiry applies
        expired = LeaseExpired(
            event_id="expire",
            job_id=dispatch.job_id,
            emitted_at=0,
            source="node-test",
            token=dispatch.token,
        )
        await rig.log.append(EVENTS, dispatch.job_id, encode_event(expired))
        done = await rig.outcome(dispatch.job_id, timeout_s=DEADLINE_S)
    assert seen == [(False, False)]
    assert isinstance(done, AttemptSucceeded)  # not cancelled: its completion comes in stale
