"""Workers on the real broker: stale dispatches never run, new pools skip old records, and only
dispatch records signed with the namespace key run."""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client import CollectorRegistry
from tests.integration.engine import all_succeeded, wait_for
from tests.integration.test_client_worker import read_to_end

from evsched.adapters.avro import encode_dispatch
from evsched.adapters.clock import now_ms
from evsched.adapters.kafka.clients import producer
from evsched.adapters.kafka.topics import ensure_topics
from evsched.adapters.proofs import generate_key as generate_node_key
from evsched.adapters.signing import DispatchKey
from evsched.client import App, Context
from evsched.core.dispatch import Dispatch
from evsched.core.planner import PlannerBudgets
from evsched.core.state import TERMINAL_STATUSES, Status, Verdict
from evsched.metrics import WorkerInstruments
from evsched.runtime.node.node import Node, NodeConfig
from evsched.runtime.replica import Replica
from evsched.runtime.worker.main import kafka_worker
from evsched.runtime.worker.worker import Worker, WorkerConfig
from evsched.settings import Settings

pytestmark = pytest.mark.broker
DEADLINE_S = 90.0
REPO = Path(__file__).resolve().parents[2]
KEY = DispatchKey(DispatchKey.generate())


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[Worker]:
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, DEADLINE_S)


@asynccontextmanager
async def node(settings: Settings, data: Path, budgets: PlannerBudgets) -> AsyncIterator[None]:
    stop = asyncio.Event()
    config = NodeConfig(
        settings=settings, node_id="n1", data_dir=data, budgets=budgets, dispatch_key=KEY
    )
    task = asyncio.create_task(Node(config).run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, DEADLINE_S)


def skipped_total(registry: CollectorRegistry) -> float:
    return sum(
        s.value
        for metric in registry.collect()
        if metric.name == "evsched_worker_dispatches_skipped"
        for s in metric.samples
        if s.name.endswith("_total")
    )


async def test_a_backlog_behind_a_slow_worker_runs_no_stale_dispatch(
    kafka_bootstrap: str, fresh_namespace: str, tmp_path: Path
) -> None:
    # Issue 9, C.7: 16 jobs of 0.25 s leased at once for one slot with a 2 s dispatch timeout.
    settings = Settings(bootstrap=kafka_bootstrap, namespace=fresh_namespace, event_partitions=2)
    await ensure_topics(kafka_bootstrap, fresh_namespace, event_partitions=2, queues=["default"])
    app = App(settings, name="it")
    ran: Counter[str] = Counter()

    @app.task(name="it.slow", max_attempts=20)
    async def slow(ctx: Context) -> None:
        ran[ctx.job_id] += 1
        await asyncio.sleep(0.25)

    registry = CollectorRegistry()
    config = WorkerConfig(queues=("default",), pool="slow", concurrency=1, poll_s=0.1)
    worker = kafka_worker(app, config, WorkerInstruments(registry), KEY)
    budgets = PlannerBudgets(dispatch_timeout_ms=2_000)
    async with Replica(settings, tmp_path / "replica") as replica:
        async with node(settings, tmp_path / "node", budgets), running(worker), app:
            jobs = [await slow.enqueue() for _ in range(16)]

            async def all_done() -> bool:
                states = [await replica.job(j) for j in jobs]
                return all(s is not None and s.status in TERMINAL_STATUSES for s in states)

            await wait_for(all_done, what="every job to end", timeout_s=DEADLINE_S)
        states = {j: await replica.job(j) for j in jobs}
        starts = [
            (j, e.verdict) for j in jobs for e in replica.timeline(j) if e.kind == "AttemptStarted"
        ]

    assert {j: s.status for j, s in states.items() if s} == dict.fromkeys(jobs, Status.SUCCEEDED)
    assert [s for s in starts if s[1] is not Verdict.APPLIED] == [], "a handler ran too late"
    assert ran == Counter(dict.fromkeys(jobs, 1)), "a healthy job's handler ran more than once"
    assert skipped_total(registry) > 0, "the backlog was meant to outlast some deadlines"


async def test_a_new_pool_does_not_rerun_finished_jobs_dispatches(
    kafka_bootstrap: str, fresh_namespace: str, tmp_path: Path
) -> None:
    # Issue 9, C.8: pool "a" ran eight jobs; pool "b", new on the same queue, must not run them.
    settings = Settings(bootstrap=kafka_bootstrap, namespace=fresh_namespace, event_partitions=2)
    await ensure_topics(kafka_bootstrap, fresh_namespace, event_partitions=2, queues=["default"])
    app = App(settings, name="it")
    ran: list[tuple[str, str]] = []

    @app.task(name="it.note")
    async def note(ctx: Context) -> None:
        ran.append((ctx.worker_id, ctx.job_id))

    pool_a = WorkerConfig(queues=("default",), pool="a", worker_id="wa", poll_s=0.1)
    lookback_ms = 1_000
    pool_b = replace(pool_a, pool="b", worker_id="wb", start_lookback_ms=lookback_ms)
    registry = CollectorRegistry()
    async with (
        Replica(settings, tmp_path / "replica") as replica,
        node(settings, tmp_path / "node", PlannerBudgets()),
        app,
    ):
        async with running(kafka_worker(app, pool_a, dispatch_key=KEY)):
            finished = [await note.enqueue() for _ in range(8)]
            await wait_for(
                lambda: all_succeeded(replica, finished),
                what="pool a's jobs to succeed",
                timeout_s=DEADLINE_S,
            )
        dispatched = await read_to_end(settings, f"{fresh_namespace}.dispatch.default")
        newest = max(r.timestamp for r in dispatched)

        async def older_than_lookback() -> bool:
            return now_ms() > newest + lookback_ms

        await wait_for(
            older_than_lookback,
            what="the old dispatches to leave pool b's lookback",
            timeout_s=DEADLINE_S,
        )
        worker_b = kafka_worker(app, pool_b, WorkerInstruments(registry), KEY)
        async with running(worker_b):
            marker = await note.enqueue()
            await wait_for(
                lambda: all_succeeded(replica, [marker]),
                what="pool b's own job",
                timeout_s=DEADLINE_S,
            )

    assert sorted(j for w, j in ran if w == "wa") == sorted(finished)
    assert [j for w, j in ran if w == "wb"] == [marker]
    assert skipped_total(registry) == 0, "pool b read records from before its start"


async def test_a_worker_runs_only_dispatch_records_signed_with_the_namespace_key(
    kafka_bootstrap: str, fresh_namespace: str
) -> None:
    # Issue 9, D.10: a forged dispatch runs any registered task with any arguments.
    settings = Settings(bootstrap=kafka_bootstrap, namespace=fresh_namespace, event_partitions=2)
    await ensure_topics(kafka_bootstrap, fresh_namespace, event_partitions=2, queues=["default"])
    app = App(settings, name="it")
    ran: list[int] = []

    @app.task(name="it.pay")
    async def pay(amount: int) -> None:
        ran.append(amount)

    topic = f"{fresh_namespace}.dispatch.default"

    def dispatch(n: int) -> Dispatch:
        return Dispatch(
            job_id=f"job-{n}",
            token=1,
            attempt=1,
            max_attempts=1,
            task="it.pay",
            queue="default",
            args=f'{{"args":[{n}],"kwargs":{{}}}}'.encode(),
            timeout_ms=10_000,
            lease_ms=30_000,
            run_at=now_ms(),
            enqueued_at=now_ms(),
            leased_at=now_ms(),
            partition=0,
        )

    writer = producer(settings, client_id="it-forger")
    await writer.start()
    try:
        unsigned = encode_dispatch(dispatch(1))
        await writer.send_and_wait(topic, unsigned, key=b"job-1")
        forged = encode_dispatch(dispatch(2))
        wrong = DispatchKey(DispatchKey.generate()).header(topic, forged)
        await writer.send_and_wait(topic, forged, key=b"job-2", headers=[wrong])
        genuine = encode_dispatch(dispatch(3))
        await writer.send_and_wait(
            topic, genuine, key=b"job-3", headers=[KEY.header(topic, genuine)]
        )
    finally:
        await writer.stop()

    registry = CollectorRegistry()
    config = WorkerConfig(queues=("default",), pool="signed", poll_s=0.1)
    async with running(kafka_worker(app, config, WorkerInstruments(registry), KEY)):

        async def all_taken() -> bool:
            return bool(ran) and skipped_total(registry) == 2

        await wait_for(all_taken, what="the three records handled", timeout_s=DEADLINE_S)

    assert ran == [3]
    reasons = {
        s.labels["reason"]: s.value
        for m in registry.collect()
        if m.name == "evsched_worker_dispatches_skipped"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert reasons == {"unsigned": 1, "forged": 1}


async def test_a_misconfigured_topic_stops_the_worker_with_one_line(
    kafka_bootstrap: str, fresh_namespace: str, tmp_path: Path
) -> None:
    # Issue 9, E.18: not a 79-line traceback, one line naming the topic and the setting.
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        topic = NewTopic(
            f"{fresh_namespace}.dispatch.default",
            num_partitions=1,
            replication_factor=1,
            topic_configs={"cleanup.policy": "compact"},
        )
        await admin.create_topics([topic])
    finally:
        await admin.close()
    env = {
        **os.environ,
        "EVSCHED_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "EVSCHED_NAMESPACE": fresh_namespace,
        "EVSCHED_DISPATCH_KEY": DispatchKey.generate(),
        "EVSCHED_NODE_KEY": generate_node_key(),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
    }
    done = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "evsched", "worker", "--app", "examples.app:app", "--queues", "default"),
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(done.communicate(), DEADLINE_S)
    assert done.returncode == 1
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert f"{fresh_namespace}.dispatch.default" in lines[0] and "cleanup.policy" in lines[0]
