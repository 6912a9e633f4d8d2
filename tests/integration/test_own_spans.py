"""evsched's own spans through a real broker, a node and a worker: one trace per job, a lease,
dispatch and run span per attempt, the failed attempt's run an error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tests.integration.test_client_worker import DEADLINE_S, running
from tests.otel_sdk import exporter, hex_ids, parent_id

from evsched.client import App, Context
from evsched.core.events import RetryPolicy
from evsched.runtime.node.node import Node, NodeConfig
from evsched.runtime.worker.main import kafka_worker
from evsched.runtime.worker.worker import WorkerConfig
from evsched.settings import Settings

pytestmark = pytest.mark.broker
__all__ = ["exporter"]  # the fixture


async def test_a_retried_job_is_one_trace_of_enqueue_and_two_attempts(
    kafka_bootstrap: str, namespace: str, tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    settings = Settings(bootstrap=kafka_bootstrap, namespace=namespace, event_partitions=3)
    app = App(settings, name="spans")

    @app.task(
        name="spans.flaky",
        retry=RetryPolicy(initial_backoff_ms=50, max_backoff_ms=100),
        retry_on=(ConnectionError,),
    )
    async def flaky(ctx: Context) -> int:
        if ctx.attempt == 1:
            raise ConnectionError("upstream down")
        return ctx.attempt

    def runs() -> list[str]:
        return [s.name for s in exporter.get_finished_spans() if s.name == "evsched.run"]

    stop = asyncio.Event()
    node = asyncio.create_task(
        Node(NodeConfig(settings=settings, node_id="n1", data_dir=tmp_path / "node")).run(stop)
    )
    config = WorkerConfig(queues=("default",), pool="spans", lease_ms=5_000, poll_s=0.1)
    try:
        async with running(kafka_worker(app, config)), app:
            job_id = str(await flaky.enqueue())
            async with asyncio.timeout(DEADLINE_S):
                while len(runs()) < 2:
                    await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(node, DEADLINE_S)

    found = exporter.get_finished_spans()
    (enqueue,) = [s for s in found if s.name == "evsched.enqueue"]
    assert enqueue.kind is SpanKind.PRODUCER
    assert (enqueue.attributes or {})["evsched.job_id"] == job_id
    trace_id, enqueue_id = hex_ids(enqueue)
    attempts = sorted(
        (s for s in found if s.name != "evsched.enqueue"),
        key=lambda s: ((s.attributes or {})["evsched.attempt"], s.start_time),
    )
    assert [(s.name, (s.attributes or {})["evsched.attempt"]) for s in attempts] == [
        ("evsched.lease", 1),
        ("evsched.dispatch", 1),
        ("evsched.run", 1),
        ("evsched.lease", 2),
        ("evsched.dispatch", 2),
        ("evsched.run", 2),
    ]
    for span in attempts:
        assert hex_ids(span)[0] == trace_id, span.name
        assert parent_id(span) == enqueue_id, span.name
        assert (span.attributes or {})["evsched.job_id"] == job_id
        assert span.start_time is not None and span.end_time is not None
        assert span.end_time >= span.start_time, span.name
    first, second = attempts[2], attempts[5]
    assert first.kind is second.kind is SpanKind.CONSUMER
    assert (first.status.status_code, first.status.description) == (
        StatusCode.ERROR,
        "ConnectionError",
    )
    assert (first.attributes or {})["evsched.outcome"] == "failed"
    assert (second.attributes or {})["evsched.outcome"] == "reported"
    assert second.status.status_code is StatusCode.UNSET
    # The second attempt waited out its backoff after the first ended: its lease span starts
    # at its due time, after the first run.
    assert (first.attributes or {})["evsched.token"] < (second.attributes or {})["evsched.token"]
    assert attempts[3].start_time is not None and first.end_time is not None
    assert attempts[3].start_time >= first.start_time
