"""Hostile handlers: exits and BaseExceptions fail the attempt, blocking calls stop no heartbeat,
and a handler that ignores cancellation does not hold shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time

import pytest
from structlog.testing import capture_logs

from evsched.core.events import AttemptFailed, AttemptStarted, AttemptSucceeded, LeaseRenewed
from evsched.runtime.worker.worker import serve
from tests.unit.worker_rig import Rig, make_rig, until


class Custom(BaseException):
    pass


@pytest.fixture
def rig() -> Rig:
    return make_rig()


@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
@pytest.mark.parametrize(
    ("raised", "error_type", "message"),
    [
        (SystemExit(3), "SystemExit", "3"),
        (KeyboardInterrupt(), "KeyboardInterrupt", "KeyboardInterrupt()"),
        (Custom("lost no more"), f"{__name__}.Custom", "lost no more"),
        (GeneratorExit(), "GeneratorExit", "GeneratorExit()"),
    ],
    ids=["sys.exit", "KeyboardInterrupt", "custom", "GeneratorExit"],
)
async def test_a_base_exception_in_a_handler_is_a_failed_attempt_and_the_worker_runs_on(
    rig: Rig, is_async: bool, raised: BaseException, error_type: str, message: str
) -> None:
    def escape() -> None:
        raise raised

    if is_async:

        @rig.app.task(name="escape")
        async def escape_async() -> None:
            escape()

    else:
        rig.app.task(name="escape")(escape)

    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    bad, after = rig.send("escape"), rig.send("noop")
    async with rig.worker(concurrency=1):
        failed = await rig.outcome(bad.job_id)
        assert isinstance(await rig.outcome(after.job_id), AttemptSucceeded)

    assert isinstance(failed, AttemptFailed)
    assert (failed.error_type, failed.message, failed.retryable) == (error_type, message, False)


async def test_a_blocking_async_handler_stops_no_other_attempts_heartbeats(rig: Rig) -> None:
    release = threading.Event()

    @rig.app.task(name="blocks")
    async def blocks() -> None:
        release.wait(10)  # a synchronous call in an async handler: it holds its loop

    @rig.app.task(name="waits")
    async def waits() -> None:
        await asyncio.sleep(30)

    waiting = rig.send("waits")
    blocking = rig.send("blocks")
    with capture_logs() as logs:
        async with rig.worker(concurrency=2, lease_ms=300, blocked_after_s=0.3):
            await until(lambda: len(rig.events_of(blocking.job_id, AttemptStarted)) == 1, "start")
            before = len(rig.events_of(waiting.job_id, LeaseRenewed))
            await until(lambda: any(e["event"] == "handler_loop_blocked" for e in logs), "log")
            # While the loop of async handlers stays blocked, the other attempt renews its lease.
            await until(
                lambda: len(rig.events_of(waiting.job_id, LeaseRenewed)) - before >= 3,
                "three renewals while another handler blocks",
            )
            release.set()
            await rig.outcome(blocking.job_id)
            await until(lambda: any(e["event"] == "handler_loop_unblocked" for e in logs), "ok")

    (blocked,) = [e for e in logs if e["event"] == "handler_loop_blocked"]
    assert blocking.job_id in blocked["task"] and "blocks" in blocked["task"]
    assert "test_worker_handlers.py" in blocked["handler_at"] and "blocks" in blocked["handler_at"]
    assert "threading.py" in blocked["at"]


async def test_a_handler_that_ignores_cancellation_does_not_hold_shutdown(rig: Rig) -> None:
    entered = threading.Event()

    @rig.app.task(name="stubborn")
    async def stubborn() -> None:
        entered.set()
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                continue  # swallows every cancellation

    rig.send("stubborn")
    worker_ref = []
    with capture_logs() as logs:
        started = time.monotonic()
        async with rig.worker(grace_s=0.1) as worker:
            worker_ref.append(worker)
            await until(entered.is_set, "the handler running")
        took = time.monotonic() - started

    assert took < 10
    assert worker_ref[0].lingering == 1
    (ignored,) = [e for e in logs if e["event"] == "handlers_ignored_cancellation"]
    assert "stubborn" in ignored["tasks"][0]


async def test_sigterm_shutdown_is_bounded_with_a_stubborn_handler(rig: Rig) -> None:
    entered = threading.Event()

    @rig.app.task(name="stubborn")
    async def stubborn() -> None:
        entered.set()
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                continue

    from evsched.runtime.worker.worker import Worker, WorkerConfig

    rig.send("stubborn")
    config = WorkerConfig(queues=("default",), worker_id="w1", poll_s=0.05, grace_s=0.2)
    worker = Worker(rig.app, config, feed=rig.feed, events=rig.log)
    serving = asyncio.create_task(serve(worker))
    await until(entered.is_set, "the handler running")
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(serving, 10)
    assert worker.lingering == 1
    assert sys.exc_info() == (None, None, None)


async def test_a_timed_out_handler_that_ignores_cancellation_gives_its_slot_back(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("evsched.runtime.worker.attempt.OVERRUN_BOUND_S", 0.2)

    @rig.app.task(name="stubborn")
    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                continue

    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    stuck, after = rig.send("stubborn", timeout_ms=100), rig.send("noop")
    with capture_logs() as logs:
        async with rig.worker(concurrency=1, grace_s=0.1):
            failed = await rig.outcome(stuck.job_id)
            assert isinstance(await rig.outcome(after.job_id), AttemptSucceeded)

    assert (failed.error_type, failed.retryable) == ("TimeoutError", True)
    assert [e["job_id"] for e in logs if e["event"] == "handler_ignored_cancellation"] == [
        stuck.job_id
    ]
