"""Client and worker on a real broker: enqueue, a hand-written dispatch, the attempt's events."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from evsched.adapters.avro import decode_event, encode_dispatch
from evsched.adapters.clock import now_ms
from evsched.adapters.kafka import consumer, producer
from evsched.client import App, Context
from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    AttemptStarted,
    AttemptSucceeded,
    Effect,
    Event,
    JobEnqueued,
)
from evsched.runtime.worker import Worker, WorkerConfig, kafka_worker
from evsched.settings import Settings

pytestmark = pytest.mark.broker
DEADLINE_S = 60.0


def make_app(bootstrap: str, namespace: str) -> App:
    app = App(Settings(bootstrap=bootstrap, namespace=namespace), name="it")

    @app.task(name="it.ship")
    async def ship(ctx: Context, order: str, *, qty: int) -> dict[str, Any]:
        ctx.effect("order.shipped", {"order": order, "qty": qty}, key=order)
        return {"shipped": order, "attempt": ctx.attempt}

    return app


async def read_events(settings: Settings, until: Any) -> list[tuple[int, str, Event]]:
    """(partition, key, event) of every event in ``<ns>.events`` until ``until(events)`` holds."""
    reader = consumer(settings, f"{settings.namespace}.events", group_id=None)
    seen: list[tuple[int, str, Event]] = []
    await reader.start()
    try:
        async with asyncio.timeout(DEADLINE_S):
            while not until([event for _, _, event in seen]):
                batches = await reader.getmany(timeout_ms=200)
                for records in batches.values():
                    seen += [(r.partition, r.key.decode(), decode_event(r.value)) for r in records]
    finally:
        await reader.stop()
    return seen


async def write_dispatch(settings: Settings, dispatch: Dispatch) -> None:
    writer = producer(settings, client_id="it-node-stand-in")
    await writer.start()
    try:
        topic = f"{settings.namespace}.dispatch.{dispatch.queue}"
        await writer.send_and_wait(topic, encode_dispatch(dispatch), key=dispatch.job_id.encode())
    finally:
        await writer.stop()


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, DEADLINE_S)


async def committed_offset(bootstrap: str, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return max((meta.offset for tp, meta in offsets.items() if tp.topic == topic), default=-1)


async def test_enqueue_then_a_dispatch_runs_the_attempt_and_logs_its_events(
    kafka_bootstrap: str, namespace: str
) -> None:
    app = make_app(kafka_bootstrap, namespace)
    async with app:
        job_id = await app.get_task("it.ship").enqueue("A-17", qty=2)

    events = await read_events(
        app.settings, lambda seen: any(isinstance(e, JobEnqueued) for e in seen)
    )
    ((_, key, enqueued),) = events
    assert key == job_id
    assert isinstance(enqueued, JobEnqueued)
    assert json.loads(enqueued.args) == {"args": ["A-17"], "kwargs": {"qty": 2}}

    dispatch = Dispatch(
        job_id=job_id,
        token=1,
        attempt=1,
        max_attempts=enqueued.max_attempts,
        task=enqueued.task,
        queue=enqueued.queue,
        args=enqueued.args,
        timeout_ms=enqueued.timeout_ms,
        lease_ms=30_000,
        run_at=now_ms(),
        enqueued_at=enqueued.emitted_at,
        leased_at=now_ms(),
        partition=events[0][0],
    )
    await write_dispatch(app.settings, dispatch)
    config = WorkerConfig(queues=("default",), pool="it", lease_ms=3_000, poll_s=0.1)
    async with running(kafka_worker(app, config)):
        events = await read_events(
            app.settings, lambda seen: any(isinstance(e, AttemptSucceeded) for e in seen)
        )

    partitions = {partition for partition, _, _ in events}
    assert len(partitions) == 1, "all of a job's events share its partition"
    assert {key for _, key, _ in events} == {job_id}
    kinds = [type(event).__name__ for _, _, event in events]
    assert kinds[:2] == ["JobEnqueued", "AttemptStarted"]
    assert kinds[-1] == "AttemptSucceeded"
    started = events[1][2]
    succeeded = events[-1][2]
    assert isinstance(started, AttemptStarted) and isinstance(succeeded, AttemptSucceeded)
    assert (started.token, started.worker_id, started.lease_ms) == (1, config.worker_id, 3_000)
    assert succeeded.token == 1
    assert json.loads(succeeded.result) == {"shipped": "A-17", "attempt": 1}
    assert succeeded.effects == (
        Effect(kind="order.shipped", payload=b'{"order":"A-17","qty":2}', key="A-17"),
    )
    group = f"{namespace}.workers.it"
    assert await committed_offset(kafka_bootstrap, group, f"{namespace}.dispatch.default") == 1
    await app.close()


async def test_enqueue_sync_from_threads_reaches_the_broker(
    kafka_bootstrap: str, namespace: str
) -> None:
    app = make_app(kafka_bootstrap, namespace)
    task = app.get_task("it.ship")
    job_ids: list[str] = []

    def enqueue(order: str) -> None:
        job_ids.append(task.enqueue_sync(order, qty=1))

    threads = [threading.Thread(target=enqueue, args=(f"S-{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join)
    await asyncio.to_thread(app.close_sync)

    events = await read_events(
        app.settings,
        lambda seen: len([e for e in seen if isinstance(e, JobEnqueued)]) == 3,
    )
    assert sorted(job_ids) == sorted(event.job_id for _, _, event in events)
    assert all(key == event.job_id for _, key, event in events)


async def test_a_full_worker_pauses_and_still_runs_every_dispatch_in_turn(
    kafka_bootstrap: str, namespace: str
) -> None:
    app = App(Settings(bootstrap=kafka_bootstrap, namespace=namespace), name="it")

    @app.task(name="it.step")
    async def step(ctx: Context) -> int:
        await asyncio.sleep(0.3)  # the job's own work, long enough for the worker to sit full
        return ctx.token

    dispatches = [
        Dispatch(
            job_id=f"job-{n}",
            token=n,
            attempt=1,
            max_attempts=1,
            task="it.step",
            queue="default",
            args=b'{"args":[],"kwargs":{}}',
            timeout_ms=10_000,
            lease_ms=30_000,
            run_at=now_ms(),
            enqueued_at=now_ms(),
            leased_at=now_ms(),
            partition=0,
        )
        for n in range(1, 5)
    ]
    for dispatch in dispatches:
        await write_dispatch(app.settings, dispatch)
    config = WorkerConfig(queues=("default",), pool="solo", concurrency=1, poll_s=0.1)
    worker = kafka_worker(app, config)
    async with running(worker):
        events = await read_events(
            app.settings,
            lambda seen: len([e for e in seen if isinstance(e, AttemptSucceeded)]) == 4,
        )
    await app.close()

    assert worker.peak_running == 1
    assert sorted(e.token for _, _, e in events if isinstance(e, AttemptSucceeded)) == [1, 2, 3, 4]
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(f"{namespace}.workers.solo")
    finally:
        await admin.close()
    assert sum(meta.offset for meta in offsets.values() if meta.offset > 0) == 4
