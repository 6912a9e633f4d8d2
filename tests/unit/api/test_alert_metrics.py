"""Metrics the shipped alert rules need: dead letters per queue, owned partitions, worker queues."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from evsched.core.events import (
    AttemptFailed,
    AttemptStarted,
    JobCancelled,
    JobLeased,
    JobRequeued,
)
from evsched.metrics import NodeInstruments, WorkerInstruments
from tests.prometheus import parse, value
from tests.unit.api.test_api_metrics import enqueue, scrape
from tests.unit.api.test_api_twin import Harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


async def fail_for_good(api: Harness, job_id: str, token: int) -> None:
    common = {"job_id": job_id, "emitted_at": 0, "token": token}
    await api.replica.append(
        JobLeased(event_id=f"l{token}", source="node", attempt=1, lease_ms=60_000, **common)
    )
    await api.replica.append(
        AttemptStarted(event_id=f"s{token}", source="w", worker_id="w", lease_ms=60_000, **common)
    )
    await api.replica.append(
        AttemptFailed(
            event_id=f"f{token}",
            source="w",
            error_type="Boom",
            message="no",
            retryable=False,
            **common,
        )
    )


async def test_each_job_going_dead_counts_once_per_queue(api: Harness) -> None:
    job_id = await enqueue(api, queue="q", max_attempts=1)
    other = await enqueue(api, queue="q")
    await fail_for_good(api, job_id, token=1)
    samples = await scrape(api)
    assert value(samples, "evsched_dead_letters_total", queue="q") == 1
    # A cancelled job is not a dead letter; a dead job requeued and dead again counts again.
    await api.replica.append(JobCancelled(event_id="c", job_id=other, emitted_at=0, source="api"))
    await api.replica.append(JobRequeued(event_id="rq", job_id=job_id, emitted_at=0, source="api"))
    await fail_for_good(api, job_id, token=2)
    samples = await scrape(api)
    assert value(samples, "evsched_dead_letters_total", queue="q") == 2
    assert value(samples, "evsched_jobs", queue="q", status="dead") == 1


def test_a_node_shows_each_owned_partition_at_scrape_time() -> None:
    registry = CollectorRegistry()
    owned = {3: "runner", 1: "runner"}
    NodeInstruments(registry).watch_owned(lambda: list(owned))
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "evsched_node_partitions_owned") == 2
    assert value(samples, "evsched_node_partition_owned", partition="1") == 1
    assert value(samples, "evsched_node_partition_owned", partition="3") == 1
    del owned[3]  # revoked: its series goes, so an alert sees the partition without an owner
    samples = parse(generate_latest(registry).decode())
    assert value(samples, "evsched_node_partitions_owned") == 1
    assert ("evsched_node_partition_owned", frozenset({("partition", "3")})) not in samples


def test_a_worker_names_the_queues_it_serves() -> None:
    instruments = WorkerInstruments()
    instruments.serving(("billing", "mail"))
    samples = parse(generate_latest(instruments.registry).decode())
    assert value(samples, "evsched_worker_queues", queue="billing") == 1
    assert value(samples, "evsched_worker_queues", queue="mail") == 1
    assert len([key for key in samples if key[0] == "evsched_worker_queues"]) == 2
