"""The worker loop against in-memory twins: outcomes, timeouts, heartbeats, limits and shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.client import Context
from evsched.client.context import AttemptFinished
from evsched.client.loader import load_app
from evsched.core.bounds import MAX_PRELEASE_MS
from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    AttemptCheckpointed,
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Effect,
    LeaseRenewed,
)
from evsched.core.state import JobState, Status
from evsched.errors import EvschedError
from evsched.metrics import WorkerInstruments
from evsched.runtime.worker.log_clock import MAX_OFFSET_MS, SAMPLES, LogClock
from evsched.runtime.worker.worker import Worker, WorkerConfig, serve
from evsched.testing import FrozenClock, MemoryReader
from tests.states import job_state
from tests.unit.worker_rig import EVENTS, Rig, make_rig, until


class Boom(Exception):
    pass


@pytest.fixture
def rig() -> Rig:
    return make_rig()


async def test_success_writes_started_then_succeeded_with_result_and_effects(rig: Rig) -> None:
    @rig.app.task(name="add")
    async def add(ctx: Context, a: int, b: int) -> dict[str, int]:
        ctx.effect("sum.computed", {"sum": a + b}, key="k1")
        ctx.effect("raw", b"\x00\x01")
        return {"sum": a + b}

    dispatch = rig.send("add", 2, 3)
    async with rig.worker(lease_ms=30_000):
        done = await rig.outcome(dispatch.job_id)

    started, succeeded = rig.events_of(dispatch.job_id, AttemptStarted, AttemptSucceeded)
    assert started.token == succeeded.token == dispatch.token
    assert (started.worker_id, started.lease_ms, started.source) == ("w1", 30_000, "worker-w1")
    assert done.result == b'{"sum":5}'
    assert done.effects == (
        Effect(kind="sum.computed", payload=b'{"sum":5}', key="k1"),
        Effect(kind="raw", payload=b"\x00\x01"),
    )
    assert {(r.topic, r.key) for r in rig.log.records} == {(EVENTS, dispatch.job_id)}
    assert [r.offset for r in rig.feed.committed] == [0]


async def test_metrics_count_outcomes_and_durations_by_task_and_running_attempts(rig: Rig) -> None:
    gate = asyncio.Event()

    @rig.app.task(name="ok")
    async def ok() -> None:
        await gate.wait()

    @rig.app.task(name="bad", permanent_on=(ValueError,))
    async def bad(fail_with: str) -> None:
        raise ValueError(fail_with) if fail_with == "value" else ConnectionError(fail_with)

    registry = CollectorRegistry()
    instruments = WorkerInstruments(registry)

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    held = rig.send("ok")
    permanent, retryable = rig.send("bad", "value"), rig.send("bad", "conn")
    async with rig.worker(instruments=instruments):
        await rig.outcome(permanent.job_id)
        await rig.outcome(retryable.job_id)
        await rig.log.wait_for(
            lambda _: bool(rig.events_of(held.job_id, AttemptStarted)), what="the held start"
        )
        assert sample("evsched_worker_running_attempts") == 1
        gate.set()
        await rig.outcome(held.job_id)

    assert sample("evsched_worker_attempts_total", task="ok", outcome="reported") == 1
    assert sample("evsched_worker_attempts_total", task="bad", outcome="failed_permanent") == 1
    assert sample("evsched_worker_attempts_total", task="bad", outcome="failed") == 1
    assert sample("evsched_worker_attempt_seconds_count", task="bad") == 2
    assert sample("evsched_worker_running_attempts") == 0


async def test_the_context_describes_the_attempt(rig: Rig) -> None:
    seen: dict[str, Any] = {}

    @rig.app.task(name="look")
    def look(ctx: Context) -> None:  # sync: runs in the thread pool
        seen.update(
            job_id=ctx.job_id,
            token=ctx.token,
            attempt=ctx.attempt,
            max_attempts=ctx.max_attempts,
            key=ctx.idempotency_key,
            checkpoint=ctx.last_checkpoint,
            last=ctx.is_last_attempt,
            thread=threading.current_thread().name,
        )

    dispatch = rig.send("look", attempt=3, checkpoint=b'{"page":7}')
    async with rig.worker():
        assert isinstance(await rig.outcome(dispatch.job_id), AttemptSucceeded)

    assert seen == {
        "job_id": dispatch.job_id,
        "token": dispatch.token,
        "attempt": 3,
        "max_attempts": 3,
        "key": f"evsched:{dispatch.job_id}",
        "checkpoint": {"page": 7},
        "last": True,
        "thread": seen["thread"],
    }
    assert seen["thread"].startswith("evsched-handler")


@pytest.mark.parametrize(
    ("options", "raised", "error_type", "retryable"),
    [
        ({}, ConnectionError("reset"), "ConnectionError", True),
        ({"permanent_on": (Boom,)}, Boom("bad input"), f"{__name__}.Boom", False),
        ({"retry_on": (ConnectionError,)}, KeyError("k"), "KeyError", False),
        (
            {"retry_on": (OSError,), "permanent_on": (ConnectionError,)},
            ConnectionError(),
            "",
            False,
        ),
    ],
    ids=["retryable-by-default", "permanent_on", "not-in-retry_on", "permanent-wins"],
)
async def test_failures_are_classified_by_the_task(
    rig: Rig, options: dict[str, Any], raised: Exception, error_type: str, retryable: bool
) -> None:
    @rig.app.task(name="fails", **options)
    async def fails() -> None:
        raise raised

    dispatch = rig.send("fails")
    async with rig.worker():
        failed = await rig.outcome(dispatch.job_id)

    assert isinstance(failed, AttemptFailed)
    assert failed.error_type == (error_type or "ConnectionError")
    assert failed.retryable is retryable
    assert failed.token == dispatch.token
    assert failed.message == (str(raised) or repr(raised))


async def test_an_async_handler_past_its_timeout_is_cancelled_and_fails_retryably(
    rig: Rig,
) -> None:
    cancelled = asyncio.Event()

    @rig.app.task(name="hangs")
    async def hangs() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    dispatch = rig.send("hangs", timeout_ms=50)
    async with rig.worker():
        failed = await rig.outcome(dispatch.job_id)
        await asyncio.wait_for(cancelled.wait(), 5)

    assert (failed.error_type, failed.retryable) == ("TimeoutError", True)
    assert "50 ms" in failed.message


async def test_a_sync_handler_past_its_timeout_fails_but_keeps_its_slot_until_it_returns(
    rig: Rig,
) -> None:
    release = threading.Event()

    @rig.app.task(name="blocks")
    def blocks() -> str:
        release.wait(10)
        return "late"

    first = rig.send("blocks", timeout_ms=50)
    second = rig.send("blocks", timeout_ms=5_000)
    async with rig.worker(concurrency=1) as worker:
        failed = await rig.outcome(first.job_id)
        assert failed.error_type == "TimeoutError"
        assert worker.running == 1
        assert rig.feed.pending == 1  # the overrunning thread still holds the only slot
        release.set()
        assert isinstance(await rig.outcome(second.job_id), AttemptSucceeded)

    assert not rig.events_of(first.job_id, AttemptSucceeded)


async def test_a_handler_raising_its_own_timeout_error_is_classified_like_any_error(
    rig: Rig,
) -> None:
    @rig.app.task(name="own_timeout", permanent_on=(TimeoutError,))
    async def own_timeout() -> None:
        raise TimeoutError("upstream timed out")

    dispatch = rig.send("own_timeout")
    async with rig.worker():
        failed = await rig.outcome(dispatch.job_id)

    assert (failed.error_type, failed.retryable) == ("TimeoutError", False)


async def test_heartbeats_renew_the_lease_while_the_handler_runs(rig: Rig) -> None:
    @rig.app.task(name="slow")
    async def slow(ctx: Context) -> None:
        await rig.log.wait_for(
            lambda _: len(rig.events_of(ctx.job_id, LeaseRenewed)) >= 2,
            what="two renewals",
        )

    dispatch = rig.send("slow")
    async with rig.worker(lease_ms=60):
        assert isinstance(await rig.outcome(dispatch.job_id), AttemptSucceeded)

    events = rig.events_of(dispatch.job_id)
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "AttemptStarted"
    assert kinds[-1] == "AttemptSucceeded"
    renewals = [e for e in events if isinstance(e, LeaseRenewed)]
    assert all((r.token, r.lease_ms) == (dispatch.token, 60) for r in renewals)


async def test_never_more_attempts_than_the_concurrency_limit(rig: Rig) -> None:
    gate = asyncio.Event()

    @rig.app.task(name="gated")
    async def gated() -> None:
        await gate.wait()

    jobs = [rig.send("gated") for _ in range(5)]
    async with rig.worker(concurrency=2) as worker:
        await rig.log.wait_for(
            lambda log: len(log.events(AttemptStarted)) == 2, what="two attempts started"
        )
        await rig.feed.wait_for(lambda feed: 0 in feed.requests, what="a keep-alive poll")
        assert (worker.running, rig.feed.pending) == (2, 3)
        gate.set()
        for job in jobs:
            assert isinstance(await rig.outcome(job.job_id), AttemptSucceeded)

    assert worker.peak_running == 2
    assert max(rig.feed.requests) <= 2


async def test_stop_finishes_running_attempts_and_takes_no_more(rig: Rig) -> None:
    gate = asyncio.Event()

    @rig.app.task(name="gated")
    async def gated() -> None:
        await gate.wait()

    running = rig.send("gated")
    worker = Worker(
        rig.app,
        WorkerConfig(queues=("default",), poll_s=0.05, grace_s=5),
        feed=rig.feed,
        events=rig.log,
    )
    loop = asyncio.create_task(worker.run())
    await rig.log.wait_for(lambda log: bool(log.events(AttemptStarted)), what="a start")
    worker.stop()
    await rig.feed.wait_for(lambda feed: feed.closed == 1, what="the feed closed")
    late = rig.send("gated")
    assert (worker.running, loop.done()) == (1, False)
    gate.set()
    await asyncio.wait_for(loop, 5)

    assert isinstance(await rig.outcome(running.job_id, timeout_s=0), AttemptSucceeded)
    assert rig.events_of(late.job_id) == []
    assert rig.feed.pending == 1
    assert (rig.log.closed, rig.feed.closed) == (1, 1)


async def test_attempts_left_after_the_grace_period_are_abandoned(rig: Rig) -> None:
    entered, cancelled = threading.Event(), threading.Event()

    @rig.app.task(name="stuck")
    async def stuck() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    dispatch = rig.send("stuck")
    with capture_logs() as logs:
        async with rig.worker(grace_s=0.05):
            await until(entered.is_set, "the handler running")

    assert cancelled.is_set()
    assert rig.events_of(dispatch.job_id, AttemptSucceeded, AttemptFailed) == []
    assert any(entry["event"] == "worker_grace_expired" for entry in logs)


async def test_undecodable_dispatch_records_are_logged_and_skipped(rig: Rig) -> None:
    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    rig.feed.put(b"not avro")
    rig.feed.put(None)
    dispatch = rig.send("noop")
    with capture_logs() as logs:
        async with rig.worker():
            assert isinstance(await rig.outcome(dispatch.job_id), AttemptSucceeded)

    skipped = [entry for entry in logs if entry["event"] == "dispatch_undecodable"]
    assert [(e["partition"], e["offset"]) for e in skipped] == [(0, 0), (0, 1)]
    assert {e.job_id for e in rig.log.events()} == {dispatch.job_id}


@pytest.mark.parametrize(
    ("fields", "error_type", "retryable"),
    [
        ({"task": "nobody.knows"}, "evsched.UnknownTask", True),
        ({"args": b"[1, 2"}, "evsched.InvalidArguments", False),
        ({"args": b'{"args": [1, 2, 3], "kwargs": {}}'}, "evsched.InvalidArguments", False),
    ],
    ids=["unknown-task", "args-not-json", "args-do-not-fit"],
)
async def test_dispatches_that_cannot_run_fail_with_a_clear_error(
    rig: Rig, fields: dict[str, Any], error_type: str, retryable: bool
) -> None:
    @rig.app.task(name="one_arg")
    async def one_arg(x: int) -> int:
        return x

    dispatch = rig.send(fields.pop("task", "one_arg"), **fields)
    async with rig.worker():
        failed = await rig.outcome(dispatch.job_id)

    assert (failed.error_type, failed.retryable) == (error_type, retryable)
    assert rig.events_of(dispatch.job_id, AttemptStarted)


async def test_a_result_that_is_not_json_fails_permanently(rig: Rig) -> None:
    @rig.app.task(name="odd")
    async def odd() -> object:
        return object()

    dispatch = rig.send("odd")
    async with rig.worker():
        failed = await rig.outcome(dispatch.job_id)

    assert (failed.error_type, failed.retryable) == ("evsched.ResultNotJson", False)


async def test_a_result_too_big_for_the_log_fails_permanently(rig: Rig) -> None:
    @rig.app.task(name="huge")
    async def huge() -> str:
        return "x" * 1_000_000

    dispatch = rig.send("huge")
    async with rig.worker():
        failed = await rig.outcome(dispatch.job_id)

    assert (failed.error_type, failed.retryable) == ("evsched.ResultTooLarge", False)


async def test_no_attempt_starts_before_run_at(rig: Rig) -> None:
    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    run_at = SYSTEM_CLOCK.now_ms() + 150
    dispatch = rig.send("noop", run_at=run_at)
    async with rig.worker():
        await rig.outcome(dispatch.job_id)

    (started,) = rig.events_of(dispatch.job_id, AttemptStarted)
    assert started.emitted_at >= run_at


async def test_a_start_logged_before_run_at_is_sent_again_before_the_handler_runs(
    rig: Rig,
) -> None:
    ran: list[int] = []

    @rig.app.task(name="noop")
    async def noop() -> None:
        ran.append(SYSTEM_CLOCK.now_ms())

    run_at = SYSTEM_CLOCK.now_ms() + 100
    rig.log.log_at = run_at - 200  # the broker's clock runs 200 ms behind this worker's
    dispatch = rig.send("noop", run_at=run_at)
    with capture_logs() as logs:
        async with rig.worker():
            await until(lambda: len(rig.events_of(dispatch.job_id, AttemptStarted)) == 1, "start")
            assert ran == []  # the fold refuses that start: the handler must not run on it
            rig.log.log_at = run_at  # by the time the worker starts again, the log is due
            await rig.outcome(dispatch.job_id)

    first, second = rig.events_of(dispatch.job_id, AttemptStarted)
    assert first.token == second.token == dispatch.token and first.event_id != second.event_id
    assert len(ran) == 1
    [early] = [e for e in logs if e["event"] == "start_before_run_at"]
    assert early["early_ms"] == 200


def test_the_log_clock_is_the_smallest_recent_offset_and_ignores_stalls() -> None:
    clock = LogClock()
    assert clock.log_now(1_000) == 1_000  # nothing measured yet
    clock.observe(sent_at=1_000, log_at=1_030)
    clock.observe(sent_at=2_000, log_at=2_012)  # the shortest trip: the best estimate
    clock.observe(sent_at=3_000, log_at=3_000 + MAX_OFFSET_MS + 1)  # a stalled send
    assert clock.offset_ms == 12 and clock.log_now(5_000) == 5_012
    for n in range(SAMPLES):
        clock.observe(sent_at=n, log_at=n - 40)  # the worker's clock stepped ahead
    assert clock.offset_ms == -40


async def test_a_dispatch_due_beyond_any_pre_lease_horizon_is_skipped(rig: Rig) -> None:
    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    clock = FrozenClock()
    far = rig.send("noop", run_at=clock.now_ms() + MAX_PRELEASE_MS + 1, lease_ms=30_000)
    due = rig.send("noop", run_at=clock.now_ms())
    with capture_logs() as logs:
        async with rig.worker(clock=clock):
            await rig.outcome(due.job_id)

    assert rig.events_of(far.job_id) == []
    assert [e["job_id"] for e in logs if e["event"] == "dispatch_not_due"] == [far.job_id]


async def test_checkpoints_are_written_under_the_token_before_the_outcome(rig: Rig) -> None:
    @rig.app.task(name="pages")
    async def pages(ctx: Context) -> int:
        start = (ctx.last_checkpoint or {}).get("page", 0)
        for page in range(start + 1, start + 3):
            await ctx.checkpoint({"page": page})
        return int(ctx.last_checkpoint["page"])

    @rig.app.task(name="pages_sync")
    def pages_sync(ctx: Context) -> None:
        ctx.checkpoint_sync(["sync"])

    dispatch = rig.send("pages", checkpoint=b'{"page":4}')
    sync = rig.send("pages_sync")
    async with rig.worker():
        done = await rig.outcome(dispatch.job_id)
        await rig.outcome(sync.job_id)

    saved = rig.events_of(dispatch.job_id, AttemptCheckpointed)
    assert [(c.checkpoint, c.token) for c in saved] == [
        (b'{"page":5}', dispatch.token),
        (b'{"page":6}', dispatch.token),
    ]
    assert done.result == b"6"
    assert [c.checkpoint for c in rig.events_of(sync.job_id, AttemptCheckpointed)] == [b'["sync"]']


async def test_is_current_turns_false_once_the_lease_went_unrenewed_too_long(rig: Rig) -> None:
    clock = FrozenClock()
    answers: list[bool] = []

    @rig.app.task(name="frozen")
    async def frozen(ctx: Context) -> None:
        answers.append(await ctx.is_current())
        clock.advance(0.5)  # as if the process had been stopped for longer than its lease
        answers.append(await ctx.is_current())
        clock.advance(-0.5)  # even a renewal arriving now cannot make it current again
        answers.append(await ctx.is_current())

    dispatch = rig.send("frozen")
    async with rig.worker(clock=clock, lease_ms=300):
        await rig.outcome(dispatch.job_id)

    assert answers == [True, False, False]


def _state(job_id: str, token: int, status: Status) -> JobState:
    return job_state(job_id, status=status, queue="default", timeout_ms=1, token=token)


@pytest.mark.parametrize(
    ("known", "expected"),
    [
        (lambda d: _state(d.job_id, d.token, Status.RUNNING), True),
        (lambda d: _state(d.job_id, d.token + 1, Status.LEASED), False),
        (lambda d: _state(d.job_id, d.token, Status.SCHEDULED), False),
        (lambda d: None, False),
    ],
    ids=["current", "newer-token", "lease-expired", "unknown"],
)
async def test_is_current_asks_the_reader_when_there_is_one(
    rig: Rig, known: Callable[[Dispatch], JobState | None], expected: bool
) -> None:
    answers: list[bool] = []
    dispatch = rig.dispatch("ask")
    reader = MemoryReader()
    state = known(dispatch)

    @rig.app.task(name="ask")
    async def ask(ctx: Context) -> None:
        # What the projection shows once the attempt runs (before, the worker would not start it).
        if state is not None:
            reader.jobs[dispatch.job_id] = state
        answers.append(await ctx.is_current())

    rig.feed.put_dispatch(dispatch)
    async with rig.worker(reader=reader):
        await rig.outcome(dispatch.job_id)

    assert answers == [expected]


async def test_the_context_is_closed_once_the_attempt_ended(rig: Rig) -> None:
    kept: list[Context] = []

    @rig.app.task(name="keeps")
    async def keeps(ctx: Context) -> None:
        kept.append(ctx)

    dispatch = rig.send("keeps")
    async with rig.worker():
        await rig.outcome(dispatch.job_id)

    with pytest.raises(AttemptFinished):
        kept[0].effect("late", b"")
    assert await kept[0].is_current() is False


async def test_when_attempt_started_cannot_be_written_the_handler_never_runs(rig: Rig) -> None:
    calls: list[str] = []

    @rig.app.task(name="noop")
    async def noop() -> None:
        calls.append("ran")

    rig.log.fail_next()
    lost = rig.send("noop")
    later = rig.send("noop")
    with capture_logs() as logs:
        async with rig.worker(concurrency=1):
            await rig.outcome(later.job_id)

    assert rig.events_of(lost.job_id) == []
    assert calls == ["ran"]
    assert [e["job_id"] for e in logs if e["event"] == "attempt_abandoned"] == [lost.job_id]


async def test_a_failed_renewal_is_logged_and_the_next_one_retried(rig: Rig) -> None:
    @rig.app.task(name="slow")
    async def slow(ctx: Context) -> None:
        rig.log.fail_next()
        await rig.log.wait_for(
            lambda _: len(rig.events_of(ctx.job_id, LeaseRenewed)) >= 1, what="a renewal"
        )

    dispatch = rig.send("slow")
    with capture_logs() as logs:
        async with rig.worker(lease_ms=60):
            assert isinstance(await rig.outcome(dispatch.job_id), AttemptSucceeded)

    assert any(e["event"] == "lease_renew_failed" for e in logs)


ROOT = Path(__file__).resolve().parents[4]


def test_load_app_finds_an_app_by_module_and_attribute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    app = load_app("examples.app:app")

    assert "example.flaky" in app.tasks
    assert app.queues == ("default",)


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("examples.app", "module:attribute"),
        ("no_such_module_here:app", "cannot import"),
        ("examples.app:noop", "not an evsched App"),
        ("examples.app:missing", "not an evsched App"),
    ],
)
def test_load_app_explains_what_is_wrong(
    monkeypatch: pytest.MonkeyPatch, reference: str, message: str
) -> None:
    monkeypatch.chdir(ROOT)
    with pytest.raises(typer.BadParameter, match=message):
        load_app(reference)


def test_worker_config_refuses_nonsense() -> None:
    with pytest.raises(EvschedError):
        WorkerConfig(queues=())
    with pytest.raises(EvschedError):
        WorkerConfig(queues=("q",), concurrency=0)
    with pytest.raises(EvschedError, match="start_lookback_ms"):
        WorkerConfig(queues=("q",), start_lookback_ms=-1)
    with pytest.raises(EvschedError, match="blocked_after_s"):
        WorkerConfig(queues=("q",), blocked_after_s=0)


async def test_sigterm_stops_taking_work_and_lets_the_running_attempt_finish(rig: Rig) -> None:
    gate = asyncio.Event()

    @rig.app.task(name="gated")
    async def gated() -> None:
        await gate.wait()

    dispatch = rig.send("gated")
    worker = Worker(
        rig.app, WorkerConfig(queues=("default",), poll_s=0.05), feed=rig.feed, events=rig.log
    )
    serving = asyncio.create_task(serve(worker))
    await rig.log.wait_for(lambda log: bool(log.events(AttemptStarted)), what="a start")
    os.kill(os.getpid(), signal.SIGTERM)
    await rig.feed.wait_for(lambda feed: feed.closed == 1, what="the feed closed")
    gate.set()
    await asyncio.wait_for(serving, 5)

    assert isinstance(await rig.outcome(dispatch.job_id, timeout_s=0), AttemptSucceeded)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
