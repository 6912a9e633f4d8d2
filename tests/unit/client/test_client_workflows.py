"""client.workflows over the MemoryLog twin: chains and groups planned into waiting jobs, written
in one transaction with their registrations, idempotent under a key; ``after=`` on enqueue."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from evsched.client import App, Outcome, chain, group
from evsched.core.events import ChildRegistered, JobEnqueued
from evsched.errors import InvalidEnqueue, PublishError
from evsched.settings import Settings
from evsched.testing import MemoryLog


@pytest.fixture
async def app_log() -> AsyncIterator[tuple[App, MemoryLog]]:
    log = MemoryLog()
    app = App(Settings(namespace="wf"), log_factory=lambda: log)

    @app.task(name="t.add", queue="q")
    async def add(*numbers: int) -> int:
        return sum(numbers)

    @app.task(name="t.total", queue="q")
    async def total(results: list[int]) -> int:
        return sum(results)

    async with app:
        yield app, log


def _waits(log: MemoryLog) -> dict[str, tuple[tuple[str, ...], str]]:
    return {e.job_id: (e.after, e.results_to_args) for e in log.events(JobEnqueued)}  # type: ignore[union-attr]


async def test_a_chain_passes_each_result_to_the_next(app_log: tuple[App, MemoryLog]) -> None:
    app, log = app_log
    add = app.get_task("t.add")
    handle = await app.enqueue_workflow(chain(add.s(1), add.s(2), add.s(3)))
    a, b, c = handle.job_ids
    assert handle.last == c
    assert _waits(log) == {a: ((), "none"), b: ((a,), "append"), c: ((b,), "append")}
    registered = [(e.job_id, e.child_id) for e in log.events(ChildRegistered)]  # type: ignore[union-attr]
    assert registered == [(a, b), (b, c)]
    log.fail_next()  # one atomic write: all of it or nothing
    with pytest.raises(PublishError):
        await app.enqueue_workflow(chain(add.s(1), add.s(2)))
    assert len(log.events()) == 5


async def test_a_group_with_a_callback_gets_the_list(app_log: tuple[App, MemoryLog]) -> None:
    app, log = app_log
    add, total = app.get_task("t.add"), app.get_task("t.total")
    handle = await app.enqueue_workflow(group([add.s(1), add.s(2), add.s(3)], callback=total.s()))
    *members, callback = handle.job_ids
    assert _waits(log)[callback] == (tuple(members), "list")
    assert handle.last == callback and len(handle.tails) == 1
    enqueue = next(e for e in log.events(JobEnqueued) if e.job_id == callback)
    assert json.loads(enqueue.args) == {"args": [], "kwargs": {}}  # results come at release


async def test_a_keyed_workflow_is_the_same_jobs_again(app_log: tuple[App, MemoryLog]) -> None:
    app, _ = app_log
    add = app.get_task("t.add")
    first = await app.enqueue_workflow(chain(add.s(1), add.s(2)), key="nightly")
    again = await app.enqueue_workflow(chain(add.s(1), add.s(2)), key="nightly")
    assert first.job_ids == again.job_ids


async def test_after_on_enqueue_registers_with_each_parent(app_log: tuple[App, MemoryLog]) -> None:
    app, log = app_log
    add = app.get_task("t.add")
    job = await add.options(after=["p1", "p2"], after_rule="all_finished").enqueue(1)
    [event] = log.events(JobEnqueued)
    assert isinstance(event, JobEnqueued) and event.after == ("p1", "p2")
    assert event.after_rule == "all_finished"
    assert [(e.job_id, e.child_id) for e in log.events(ChildRegistered)] == [  # type: ignore[union-attr]
        ("p1", job),
        ("p2", job),
    ]
    with pytest.raises(InvalidEnqueue, match="after_rule"):
        await add.options(after=["p1"], after_rule="sometimes").enqueue(1)
    with pytest.raises(InvalidEnqueue, match="after"):
        await add.options(after="p1").enqueue(1)


async def test_a_batch_with_after_must_be_atomic(app_log: tuple[App, MemoryLog]) -> None:
    app, log = app_log
    waiting = app.get_task("t.add").options(after=["p"])
    [loose] = await app.enqueue_many([waiting.call(1)])
    assert (loose.outcome, loose.field) == (Outcome.INVALID, "after")
    [tight] = await app.enqueue_many([waiting.call(1)], atomic=True)
    assert tight.outcome is Outcome.ACCEPTED
    assert [e.job_id for e in log.events(ChildRegistered)] == ["p"]


def test_empty_workflows_are_refused() -> None:
    with pytest.raises(InvalidEnqueue):
        chain()
    with pytest.raises(InvalidEnqueue):
        group([])


async def test_a_group_alone_and_nested_steps(app_log: tuple[App, MemoryLog]) -> None:
    app, log = app_log
    add, total = app.get_task("t.add"), app.get_task("t.total")
    alone = await app.enqueue_workflow(group([add.s(1), add.s(2)]))
    assert alone.tails == alone.jobs and all(not w[0] for w in _waits(log).values())
    # chain(a, group([b, chain(c, d)]), e): b and c wait on a; d on c; e gets [b, d]
    flow = chain(add.s(1), group([add.s(2), chain(add.s(3), add.s(4))]), total.s())
    a, b, c, d, e = (await app.enqueue_workflow(flow)).job_ids
    waits = _waits(log)
    assert waits[b] == ((a,), "append") and waits[c] == ((a,), "append")
    assert waits[d] == ((c,), "append") and waits[e] == ((b, d), "list")
