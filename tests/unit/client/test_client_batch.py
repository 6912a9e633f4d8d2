"""``App.enqueue_many`` and the control methods over the MemoryLog twin: one round trip, a verdict
per call, atomic batches all or none, pauses written to every partition."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from evsched.client import App, Outcome
from evsched.core import ids
from evsched.core.events import JobEnqueued, QueuePaused, QueueResumed, SchedulePaused
from evsched.errors import InvalidEnqueue, PublishError
from evsched.settings import Settings
from evsched.testing import MemoryLog


@pytest.fixture
async def app_log() -> AsyncIterator[tuple[App, MemoryLog]]:
    log = MemoryLog()
    app = App(Settings(namespace="batch"), log_factory=lambda: log)

    @app.task(name="t.add", queue="q")
    async def add(a: int, b: int) -> int:
        return a + b

    async with app:
        yield app, log


async def test_a_batch_gives_a_verdict_per_call_in_order(app_log: tuple[App, MemoryLog]) -> None:
    app, log = app_log
    add = app.get_task("t.add")
    keyed = add.options(idempotency_key="k")
    calls = [add.call(1, 2), keyed.call(1, 1), keyed.call(1, 1), keyed.call(5, 5), add.call(1)]
    results = await app.enqueue_many(calls)
    assert [(r.index, r.outcome) for r in results] == [
        (0, Outcome.ACCEPTED),
        (1, Outcome.ACCEPTED),
        (2, Outcome.DUPLICATE),
        (3, Outcome.CONFLICT),
        (4, Outcome.INVALID),
    ]
    assert results[1].job_id == results[2].job_id == results[3].job_id
    assert results[3].field == "idempotency_key" and results[4].field == "args"
    written = log.events(JobEnqueued)
    assert [e.job_id for e in written] == [results[0].job_id, results[1].job_id]
    assert all(r.appended is not None for r in results[:2])


async def test_an_atomic_batch_is_all_or_none(app_log: tuple[App, MemoryLog]) -> None:
    app, log = app_log
    add = app.get_task("t.add")
    refused = await app.enqueue_many([add.call(1, 2), add.call("x")], atomic=True)
    assert [r.outcome for r in refused] == [Outcome.FAILED, Outcome.INVALID]
    assert "call 1 is refused" in refused[0].message and log.events() == []
    log.fail_next()
    failed = await app.enqueue_many([add.call(1, 2), add.call(3, 4)], atomic=True)
    assert [r.outcome for r in failed] == [Outcome.FAILED] * 2 and log.events() == []
    done = await app.enqueue_many([add.call(1, 2), add.call(3, 4)], atomic=True)
    assert [r.outcome for r in done] == [Outcome.ACCEPTED] * 2 and len(log.events()) == 2


@pytest.mark.parametrize("atomic", [True, False])
async def test_a_batch_whose_jobs_wait_on_one_another_is_refused_before_any_write(
    app_log: tuple[App, MemoryLog], atomic: bool
) -> None:
    app, log = app_log
    add = app.get_task("t.add")
    one, two = (ids.job_id_for_key("q", key) for key in ("one", "two"))
    calls = [
        add.options(idempotency_key="one", after=[two]).call(1, 2),
        add.options(idempotency_key="two", after=[one]).call(3, 4),
        add.call(5, 6),
    ]
    with pytest.raises(InvalidEnqueue, match=f"cycle, so none would ever run: {one} -> {two}"):
        await app.enqueue_many(calls, atomic=atomic)
    assert log.events() == []


async def test_a_failed_write_fails_only_its_call(app_log: tuple[App, MemoryLog]) -> None:
    app, log = app_log
    add = app.get_task("t.add")
    log.fail_next()
    results = await app.enqueue_many([add.call(1, 2), add.call(3, 4)])
    assert [r.outcome for r in results] == [Outcome.FAILED, Outcome.ACCEPTED]


async def test_a_batch_above_the_limit_is_refused(app_log: tuple[App, MemoryLog]) -> None:
    app, _ = app_log
    add = app.get_task("t.add")
    with pytest.raises(InvalidEnqueue, match="calls"):
        await app.enqueue_many([add.call(1, 2)] * 10_001)


def test_sync_controls_and_batches() -> None:
    log = MemoryLog()
    app = App(Settings(namespace="batch"), log_factory=lambda: log)

    @app.task(name="t.one", queue="q")
    def one() -> None:
        return None

    with app:
        assert [r.outcome for r in app.enqueue_many_sync([one.call()])] == [Outcome.ACCEPTED]
        app.pause_queue_sync("q", reason="deploy")
        app.resume_queue_sync("q")
        app.pause_schedule_sync("nightly")
        app.resume_schedule_sync("nightly")
    kinds = [type(e).__name__ for e in log.events()]
    assert kinds == [
        "JobEnqueued",
        "QueuePaused",
        "QueueResumed",
        "SchedulePaused",
        "ScheduleResumed",
    ]
    [pause] = log.events(QueuePaused)
    assert (pause.queue, pause.reason) == ("q", "deploy")


async def test_controls_are_checked_and_a_partial_write_is_an_error(
    app_log: tuple[App, MemoryLog],
) -> None:
    app, log = app_log
    with pytest.raises(InvalidEnqueue, match="queue"):
        await app.pause_queue("bad queue!")
    with pytest.raises(InvalidEnqueue, match="reason"):
        await app.pause_schedule("s", reason="x" * 2_000)
    log.fail_next()
    with pytest.raises(PublishError, match="reached 0 of 1 partitions"):
        await app.resume_queue("q")
    assert log.events(QueueResumed) == [] and log.events(SchedulePaused) == []


async def test_a_batch_takes_the_namespace_retention_and_key_window_as_enqueue_does() -> None:
    log = MemoryLog()
    settings = Settings(namespace="batch", retention_ms=86_400_000, key_window_ms=3_600_000)
    app = App(settings, log_factory=lambda: log)

    @app.task(name="t.add", queue="q")
    async def add(a: int, b: int) -> int:
        return a + b

    async with app:
        await app.get_task("t.add").enqueue(1, 2)
        results = await app.enqueue_many([app.get_task("t.add").call(3, 4)])
    assert [r.outcome for r in results] == [Outcome.ACCEPTED]
    single, batched = log.events(JobEnqueued)
    assert (single.retention_ms, single.key_window_ms) == (86_400_000, 3_600_000)
    assert (batched.retention_ms, batched.key_window_ms) == (86_400_000, 3_600_000)
