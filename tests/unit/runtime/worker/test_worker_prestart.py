"""Issue 32, item 3: before a handler starts, its worker knows the fold accepted the start (the
job was not cancelled, expired or leased again since the lease) and the run lease still holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from evsched.adapters.avro import encode_event
from evsched.client.context import Context
from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    JobCancelled,
    JobLeased,
)
from evsched.core.state import Status
from evsched.ports import Appended
from evsched.runtime.worker.prestart import (
    STALL_S,
    TICK_S,
    StallWatch,
    lease_passed,
    needs_confirmation,
    start_refused,
)
from evsched.testing import FrozenClock, MemoryJobFeed, MemoryLog
from tests.states import job_state
from tests.unit.runtime.worker.test_worker_follow import lease
from tests.unit.worker_rig import EVENTS, Rig, make_rig, until

DEADLINE_S = 10.0


@pytest.mark.parametrize(
    ("held_ms", "lease_ms", "passed"),
    [
        (0, 30_000, False),
        (28_999, 30_000, False),
        (29_001, 30_000, True),  # within the 1 s margin of the end
        (749, 1_000, False),
        (751, 1_000, True),  # a short lease keeps a quarter as its margin
    ],
)
def test_the_run_lease_counts_from_the_start_s_send_with_a_margin(
    held_ms: float, lease_ms: int, passed: bool
) -> None:
    assert lease_passed(held_ms=held_ms, lease_ms=lease_ms) is passed


def test_only_a_start_the_fold_applied_for_this_worker_lets_the_handler_run() -> None:
    running = job_state(status=Status.RUNNING, token=7, worker_id="w1")
    assert start_refused(running, 7, "w1") is None
    assert start_refused(running, 7, "w2") == "token 7 runs on w1"
    assert start_refused(replace(running, status=Status.CANCELLED), 7, "w1") == (
        "the job was cancelled"
    )
    assert "leased again" in (start_refused(replace(running, token=8), 7, "w1") or "")
    # Leased, not running: the fold refused the start (past its start deadline).
    assert start_refused(replace(running, status=Status.LEASED), 7, "w1") == (
        "the fold refused the start"
    )
    assert start_refused(None, 7, "w1") == "the job is unknown"


async def cancel_before_start(rig: Rig, job_id: str) -> None:
    event = JobCancelled(event_id=f"cancel-{job_id}", job_id=job_id, emitted_at=0, source="test")
    await rig.log.append(EVENTS, job_id, encode_event(event))


async def test_a_job_cancelled_before_its_worker_took_the_dispatch_never_runs() -> None:
    # The worker was frozen: the job was leased, its dispatch sent, then cancelled, all before
    # the worker took the dispatch. Its start goes out (it cannot know yet) and is refused.
    rig = make_rig()
    ran: list[str] = []

    @rig.app.task(name="mark")
    def mark(ctx: Context) -> None:
        ran.append(ctx.job_id)

    job_id = "job-1"
    dispatch = rig.dispatch("mark", events_offset=len(rig.log.records))
    await rig.log.append(EVENTS, job_id, encode_event(leased(dispatch)))
    await cancel_before_start(rig, job_id)
    with capture_logs() as logs:
        async with rig.worker(follow=MemoryJobFeed(rig.log, EVENTS)) as worker:
            rig.feed.put_dispatch(dispatch)
            await until(lambda: worker.handled == 1, "the dispatch handled", DEADLINE_S)
    assert ran == []
    assert rig.events_of(job_id, AttemptStarted), "the start is sent (and refused by the fold)"
    assert not rig.events_of(job_id, AttemptSucceeded, AttemptFailed)
    (skipped,) = [e for e in logs if e["event"] == "handler_not_started"]
    assert skipped["reason"] == "the job was cancelled"


async def test_a_started_attempt_runs_once_its_start_is_confirmed() -> None:
    rig = make_rig()
    ran: list[bool] = []

    @rig.app.task(name="mark")
    async def mark(ctx: Context) -> None:
        ran.append(await ctx.is_current())

    feed = MemoryJobFeed(rig.log, EVENTS)
    async with rig.worker(follow=feed):
        dispatch = await lease(rig, "mark")
        done = await rig.outcome(dispatch.job_id, timeout_s=DEADLINE_S)
    assert ran == [True] and isinstance(done, AttemptSucceeded)
    assert feed.following == 0  # the follow ended with the attempt


class HeldAfterStart(MemoryLog):
    """A log whose acknowledgement of a start reaches the worker ``held_s`` later, as if the
    worker were frozen between its send and the handler."""

    def __init__(self, clock: FrozenClock, held_s: float) -> None:
        super().__init__()
        self.frozen = clock
        self.held_s = held_s

    async def append(
        self, topic: str, key: str, value: bytes, headers: Sequence[tuple[str, bytes]] = ()
    ) -> Appended:
        appended = await super().append(topic, key, value, headers)
        if isinstance(self.records[-1].event, AttemptStarted):
            self.frozen.advance(self.held_s)
        return appended


@pytest.mark.parametrize(("held_s", "runs"), [(0.5, 1), (40.0, 0)])
async def test_a_worker_held_past_its_run_lease_after_the_start_runs_no_handler(
    held_s: float, runs: int
) -> None:
    clock = FrozenClock()
    log = HeldAfterStart(clock, held_s)
    rig = make_rig()
    rig = Rig(rig.app, log, rig.feed)  # the worker's log is the one that holds it
    ran: list[str] = []

    @rig.app.task(name="mark")
    def mark(ctx: Context) -> None:
        ran.append(ctx.job_id)

    with capture_logs() as logs:
        async with rig.worker(clock=clock, lease_ms=30_000) as worker:
            rig.send("mark", leased_at=clock.now_ms())
            await until(lambda: worker.handled == 1, "the dispatch handled", DEADLINE_S)
    assert len(ran) == runs
    skipped = [e["reason"] for e in logs if e["event"] == "handler_not_started"]
    assert len(skipped) == 1 - runs
    assert all(reason.startswith("the run lease passed") for reason in skipped)


def leased(dispatch: Dispatch) -> JobLeased:
    return JobLeased(
        event_id=f"lease-{dispatch.job_id}",
        job_id=dispatch.job_id,
        emitted_at=0,
        source="node-test",
        token=dispatch.token,
        attempt=dispatch.attempt,
        lease_ms=dispatch.lease_ms,
    )


class Ticks:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_the_stall_watch_sees_a_loop_that_stood_still() -> None:
    ticks = Ticks()
    watch = StallWatch(ticks)
    watch.start()
    try:
        ticks.now += TICK_S
        watch._tick()  # on time: no stall
        assert not watch.stalled_within(30.0)
        ticks.now += TICK_S + STALL_S + 0.01  # a frozen process: the next tick comes late
        assert watch.stalled_within(30.0)  # seen before the tick too
        watch._tick()
        assert watch.stalled_at == ticks.now and watch.stalled_within(30.0)
        for _ in range(290):  # 29 s of ticks on time
            ticks.now += TICK_S
            watch._tick()
        assert watch.stalled_within(30.0) and not watch.stalled_within(28.0)
    finally:
        watch.stop()


@pytest.mark.parametrize(
    ("run_at", "log_at", "stall_s_ago", "confirm"),
    [
        (0, 10, None, False),  # a prompt start, no stall: it runs at once
        (0, 900, None, False),  # late (a backlog) but never held across a stall
        (0, 10, 5.0, True),  # a stall inside the dispatch's 30 s start window
        (0, 10, 31.0, False),  # a stall older than any dispatch it could still start
        (5_000, 5_010, None, False),  # a pre-lease held until run_at, no stall: at once
        (5_000, 5_010, 34.0, True),  # its window: the hold (5 s) and lease_ms (30 s)
        (0, None, None, True),  # a log that does not say when
    ],
)
def test_only_a_start_held_across_a_stall_or_pre_leased_waits_for_the_verdict(
    run_at: int, log_at: int | None, stall_s_ago: float | None, confirm: bool
) -> None:
    leased_at = 1_000_000
    dispatch = make_rig().dispatch(
        "t", leased_at=leased_at, run_at=leased_at + run_at if run_at else 0, lease_ms=30_000
    )
    ticks = Ticks()
    watch = StallWatch(ticks)
    if stall_s_ago is not None:
        watch.stalled_at = ticks.now - stall_s_ago
    appended = Appended(EVENTS, 0, 5, None if log_at is None else leased_at + log_at)
    assert needs_confirmation(dispatch, appended, watch) is confirm


async def test_a_prompt_start_runs_without_waiting_for_the_follow() -> None:
    # The follow never reads the start (its feed reads another, empty log): a start that waited
    # for the fold's verdict would never run. One logged right after its lease runs at once.
    rig = make_rig()
    ran: list[str] = []

    @rig.app.task(name="mark")
    def mark(ctx: Context) -> None:
        ran.append(ctx.job_id)

    dispatch = rig.dispatch("mark", events_offset=0)
    rig.log.log_at = dispatch.leased_at + 5
    async with rig.worker(follow=MemoryJobFeed(MemoryLog(), EVENTS)):
        rig.feed.put_dispatch(dispatch)
        done = await rig.outcome(dispatch.job_id, timeout_s=DEADLINE_S)
    assert ran == [dispatch.job_id] and isinstance(done, AttemptSucceeded)
