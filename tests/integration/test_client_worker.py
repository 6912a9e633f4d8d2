"""Client and worker on a real broker: enqueue, a hand-written dispatch, the attempt's events."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from evsched.adapters.avro import decode_event, encode_dispatch
from evsched.adapters.clock import now_ms
from evsched.adapters.kafka.clients import consumer, producer
from evsched.adapters.kafka.topics import partition_count
from evsched.client import App, Context
from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    AttemptSucceeded,
    Effect,
    Event,
    JobEnqueued,
    RetryPolicy,
)
from evsched.core.state import Status
from evsched.runtime.node.node import Node, NodeConfig
from evsched.runtime.replica import Replica
from evsched.runtime.worker.main import ensure_worker_topics, kafka_worker
from evsched.runtime.worker.worker import Worker, WorkerConfig
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
    return [
        (r.partition, r.key.decode(), decode_event(r.value))
        for r in await read_records(
            settings,
            f"{settings.namespace}.events",
            lambda records: until([decode_event(r.value) for r in records]),
        )
    ]


async def read_records(settings: Settings, topic: str, until: Any) -> list[Any]:
    """The consumer records of ``topic`` from its start, until ``until(records)`` holds."""
    reader = consumer(settings, topic, group_id=None)
    seen: list[Any] = []
    await reader.start()
    try:
        async with asyncio.timeout(DEADLINE_S):
            while not until(seen):
                batches = await reader.getmany(timeout_ms=200)
                for records in batches.values():
                    seen += records
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


async def test_jobs_run_end_to_end_through_a_node_and_a_worker(
    kafka_bootstrap: str, namespace: str, tmp_path: Path
) -> None:
    settings = Settings(bootstrap=kafka_bootstrap, namespace=namespace, event_partitions=3)
    app = App(settings, name="e2e")

    @app.task(name="e2e.ship")
    async def ship(ctx: Context, order: str) -> str:
        ctx.effect("order.shipped", {"order": order}, key=order)
        return order

    @app.task(
        name="e2e.flaky",
        retry=RetryPolicy(initial_backoff_ms=50, max_backoff_ms=100),
        retry_on=(ConnectionError,),
    )
    async def flaky(ctx: Context, failures: int) -> int:
        if ctx.attempt <= failures:
            raise ConnectionError(f"attempt {ctx.attempt}")
        return ctx.attempt

    @app.task(name="e2e.broken", permanent_on=(ValueError,))
    def broken() -> None:
        raise ValueError("bad input")

    stop = asyncio.Event()
    node_config = NodeConfig(settings=settings, node_id="n1", data_dir=tmp_path / "node")
    node = asyncio.create_task(Node(node_config).run(stop))
    worker_config = WorkerConfig(queues=("default",), pool="e2e", lease_ms=5_000, poll_s=0.1)
    try:
        async with running(kafka_worker(app, worker_config)), app:
            shipped = await ship.enqueue("B-2")
            retried = await flaky.enqueue(2)
            dead = await broken.enqueue()
            records = await read_records(
                settings,
                f"{namespace}.events",
                lambda seen: _outcomes(seen) >= {shipped, retried, dead},
            )
    finally:
        stop.set()
        await asyncio.wait_for(node, DEADLINE_S)

    async with Replica(settings, tmp_path / "replica") as replica:
        for record in records:
            await replica.wait_for(record.partition, record.offset, timeout_s=DEADLINE_S)
        states = {job_id: await replica.job(job_id) for job_id in (shipped, retried, dead)}
    assert {job_id: s.status for job_id, s in states.items() if s} == {
        shipped: Status.SUCCEEDED,
        retried: Status.SUCCEEDED,
        dead: Status.DEAD,
    }
    assert states[retried] is not None and states[retried].attempt == 3
    assert states[dead] is not None and states[dead].last_error is not None
    assert states[dead].last_error.error_type == "ValueError"
    effects = await read_to_end(settings, f"{namespace}.effects")
    assert [(r.key.decode(), r.value) for r in effects] == [(shipped, b'{"order":"B-2"}')]


async def read_to_end(settings: Settings, topic: str) -> list[Any]:
    """Every committed record of ``topic`` now (the node that writes it has stopped)."""
    count = await partition_count(settings.bootstrap, topic)
    partitions = [TopicPartition(topic, p) for p in range(count)]
    reader = consumer(settings, group_id=None)
    seen: list[Any] = []
    await reader.start()
    try:
        reader.assign(partitions)
        await reader.seek_to_beginning(*partitions)
        ends = await reader.end_offsets(partitions)
        async with asyncio.timeout(DEADLINE_S):
            while [tp for tp, end in ends.items() if await reader.position(tp) < end]:
                for records in (await reader.getmany(timeout_ms=200)).values():
                    seen += records
    finally:
        await reader.stop()
    return seen


def _outcomes(records: list[Any]) -> set[str]:
    """Jobs with a success, or a permanent failure, among the consumed event records."""
    done = set()
    for record in records:
        event = decode_event(record.value)
        if isinstance(event, AttemptSucceeded) or (
            isinstance(event, AttemptFailed) and not event.retryable
        ):
            done.add(event.job_id)
    return done


async def test_a_worker_creates_its_missing_dispatch_topics(
    kafka_bootstrap: str, fresh_namespace: str
) -> None:
    app = App(Settings(bootstrap=kafka_bootstrap, namespace=fresh_namespace, event_partitions=2))
    config = WorkerConfig(queues=("default", "mail"))

    await ensure_worker_topics(app, config)

    for queue in ("default", "mail"):
        assert await partition_count(kafka_bootstrap, f"{fresh_namespace}.dispatch.{queue}") == 2
