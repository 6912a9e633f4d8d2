"""Stale work never starts: dispatches past their deadline, superseded, duplicated or finished."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.client import Context
from evsched.core.dispatch import start_deadline
from evsched.core.events import AttemptStarted, AttemptSucceeded
from evsched.core.state import Status
from evsched.metrics import WorkerInstruments
from evsched.testing import FrozenClock, MemoryReader
from tests.states import job_state
from tests.unit.worker_rig import Rig, make_rig, until


@pytest.fixture
def rig() -> Rig:
    return make_rig()


def skipped(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value("evsched_worker_dispatches_skipped_total", {"reason": reason})
    return value or 0.0


async def test_a_backlog_behind_a_slow_worker_starts_no_dispatch_past_its_deadline(
    rig: Rig,
) -> None:
    # Issue 9, C.7: ten jobs leased at once, one slot, each handler takes 0.4 s of the clock and
    # the start lease is 1 s: only the dispatches still within their deadline may start.
    clock = FrozenClock()
    ran: list[str] = []

    @rig.app.task(name="slow")
    async def slow(ctx: Context) -> None:
        ran.append(ctx.job_id)
        clock.advance(0.4)

    backlog = [rig.send("slow", leased_at=clock.now_ms(), lease_ms=1_000) for _ in range(10)]
    registry = CollectorRegistry()
    with capture_logs() as logs:
        async with rig.worker(
            clock=clock, concurrency=1, instruments=WorkerInstruments(registry)
        ) as worker:
            await until(lambda: worker.handled == len(backlog), "the backlog handled")

    started = rig.log.events(AttemptStarted)
    by_job = {d.job_id: d for d in backlog}
    assert started, "the first dispatches are in time and must run"
    assert all(e.emitted_at <= start_deadline(by_job[e.job_id]) for e in started)
    assert ran == [e.job_id for e in started] == [d.job_id for d in backlog[: len(ran)]]
    late = [d.job_id for d in backlog[len(ran) :]]
    assert len(late) >= 7
    dropped = [e for e in logs if e["event"] == "dispatch_skipped"]
    assert [(e["job_id"], e["reason"]) for e in dropped] == [(j, "expired") for j in late]
    assert all(e["late_ms"] > 0 for e in dropped)
    assert skipped(registry, "expired") == len(late)


async def test_a_pre_leased_dispatch_waits_for_run_at_without_eating_its_start_window(
    rig: Rig,
) -> None:
    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    now = SYSTEM_CLOCK.now_ms()
    # Due in 0.35 s with a 0.4 s start lease: the lease's window opens at run_at (the fold counts
    # a pre-lease's lease_ms from there), so the wait does not run it out.
    held = rig.send("noop", leased_at=now, lease_ms=400, run_at=now + 350)
    with capture_logs() as logs:
        async with rig.worker(concurrency=2):
            await rig.outcome(held.job_id)

    (started,) = rig.events_of(held.job_id, AttemptStarted)
    assert started.emitted_at >= held.run_at
    assert [e for e in logs if e["event"] == "dispatch_skipped"] == []


async def test_duplicate_and_superseded_dispatches_of_a_job_never_start(rig: Rig) -> None:
    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    newer = rig.send("noop", token=7)
    duplicate = rig.feed.put_dispatch(newer)
    older = replace(newer, token=6)
    rig.feed.put_dispatch(older)
    registry = CollectorRegistry()
    async with rig.worker(instruments=WorkerInstruments(registry), concurrency=1) as worker:
        await rig.outcome(newer.job_id)
        await until(lambda: worker.handled == 3, "all handled")

    assert [e.token for e in rig.events_of(newer.job_id, AttemptStarted)] == [7]
    assert duplicate.offset == 1
    assert (skipped(registry, "duplicate"), skipped(registry, "superseded")) == (1, 1)


async def test_a_newer_token_that_arrives_during_the_run_at_wait_supersedes(rig: Rig) -> None:
    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    waiting = rig.send("noop", token=3, run_at=SYSTEM_CLOCK.now_ms() + 300)
    rig.feed.put_dispatch(replace(waiting, token=4, run_at=0))
    with capture_logs() as logs:
        async with rig.worker(concurrency=2):
            await rig.outcome(waiting.job_id)
            await until(lambda: any(e["event"] == "dispatch_skipped" for e in logs), "a skip")

    assert [e.token for e in rig.events_of(waiting.job_id, AttemptStarted)] == [4]
    assert [e["reason"] for e in logs if e["event"] == "dispatch_skipped"] == ["superseded"]


class FailingReader:
    async def job(self, job_id: str) -> None:
        raise ConnectionError("replica down")


@pytest.mark.parametrize(
    ("status", "token_delta", "reason"),
    [
        (Status.SUCCEEDED, 0, "finished"),
        (Status.CANCELLED, 0, "finished"),
        (Status.LEASED, 1, "superseded"),
        (Status.DEAD, 1, "superseded"),
        (Status.LEASED, 0, None),
        (Status.SUCCEEDED, -1, None),
    ],
    ids=["succeeded", "cancelled", "leased-again", "dead-later", "current", "replica-behind"],
)
async def test_with_a_reader_a_job_that_finished_or_moved_on_is_not_started(
    rig: Rig, status: Status, token_delta: int, reason: str | None
) -> None:
    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    dispatch = rig.dispatch("noop")
    reader = MemoryReader()
    reader.jobs[dispatch.job_id] = job_state(
        job_id=dispatch.job_id, status=status, token=dispatch.token + token_delta
    )
    rig.feed.put_dispatch(dispatch)
    marker = rig.send("noop")
    with capture_logs() as logs:
        async with rig.worker(reader=reader, concurrency=1):
            await rig.outcome(marker.job_id)

    reasons = [e["reason"] for e in logs if e["event"] == "dispatch_skipped"]
    started = rig.events_of(dispatch.job_id, AttemptStarted)
    assert (reasons, bool(started)) == (([reason], False) if reason else ([], True))


async def test_a_reader_that_fails_does_not_stop_the_attempt(rig: Rig) -> None:
    @rig.app.task(name="noop")
    async def noop() -> None:
        return None

    dispatch = rig.send("noop")
    with capture_logs() as logs:
        async with rig.worker(reader=FailingReader()):
            assert isinstance(await rig.outcome(dispatch.job_id), AttemptSucceeded)

    assert [e["job_id"] for e in logs if e["event"] == "dispatch_reader_failed"] == [
        dispatch.job_id
    ]


async def test_the_worker_forgets_the_oldest_jobs_first(rig: Rig) -> None:
    from evsched.runtime.worker.gate import DispatchGate

    gate = DispatchGate(key=None, clock=SYSTEM_CLOCK, remembered=2)
    first, second, third = (rig.dispatch("noop") for _ in range(3))
    for dispatch in (first, second, third, first):
        rig.feed.put_dispatch(dispatch)
    admitted = [await gate.admit(r) for r in await rig.feed.take(4, 0)]
    # ``first`` was forgotten when ``third`` came, so its repeat is admitted again.
    assert admitted == [first, second, third, first]


async def test_a_start_the_log_stamps_past_the_deadline_runs_no_handler(rig: Rig) -> None:
    # Issue 9 C.7: the worker checked in time, then was held (frozen, starved) until after the
    # deadline; the broker's LogAppendTime on its AttemptStarted says so, and the handler waits
    # for nobody: the fold refuses that start and the lease's expiry costs no attempt.
    ran: list[str] = []

    @rig.app.task(name="noop")
    async def noop(ctx: Context) -> None:
        ran.append(ctx.job_id)

    dispatch = rig.send("noop")
    rig.log.log_at = dispatch.leased_at + dispatch.lease_ms
    with capture_logs() as logs:
        async with rig.worker() as worker:
            await until(lambda: worker.handled == 1, "the dispatch handled")

    assert ran == []
    assert [type(e).__name__ for e in rig.events_of(dispatch.job_id)] == ["AttemptStarted"]
    assert [e["event"] for e in logs if e["event"] == "start_after_deadline"] == [
        "start_after_deadline"
    ]
