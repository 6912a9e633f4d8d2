"""Metrics counted from the fold's commit hook, served at /metrics, and the job counts behind
/v1/stats: seeded by one scan, then moved by applied events only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from evsched.adapters.index.store import PartitionIndex
from evsched.client import App
from evsched.core.events import (
    AttemptStarted,
    AttemptSucceeded,
    JobCancelled,
    JobLeased,
    LeaseExpired,
)
from evsched.core.state import FoldedEvent, Status, Verdict
from evsched.devstack.process import free_port
from evsched.metrics import JobCounts, Metrics, serve_metrics
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector
from evsched.testing import MemoryLog
from tests.prometheus import Samples, parse, value
from tests.states import job_state
from tests.unit.api.test_api_twin import SETTINGS, Harness


async def scrape(api: Harness) -> Samples:
    response = await api.http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


async def enqueue(api: Harness, **body: object) -> str:
    response = await api.http.post("/v1/jobs", json={"task": "t", **body})
    assert response.status_code == 201, response.text
    job_id: str = response.json()["id"]
    return job_id


async def test_metrics_name_every_family(api: Harness) -> None:
    await enqueue(api)
    text = (await api.http.get("/metrics")).text
    for name in (
        "evsched_events_folded_total",
        "evsched_jobs",
        "evsched_lease_expirations_total",
        "evsched_stale_completions_total",
        "evsched_start_lateness_seconds",
        "evsched_enqueue_latency_seconds",
        "evsched_consumer_lag_records",
        "evsched_applied_offset",
        "evsched_api_writes_unconfirmed_total",
        "evsched_api_unknown_queue_refusals_total",
    ):
        assert f"# TYPE {name} " in text, name


async def test_verdicts_jobs_and_latency_are_counted(api: Harness) -> None:
    first = await enqueue(api, queue="q1")
    await enqueue(api, queue="q1")
    await api.http.post(f"/v1/jobs/{first}/cancel")
    await api.http.post(f"/v1/jobs/{first}/cancel")
    await api.log.append(api.replica.topic, "junk", b"\x00not avro")
    samples = await scrape(api)
    folded = "evsched_events_folded_total"
    assert value(samples, folded, kind="JobEnqueued", verdict="applied") == 2
    assert value(samples, folded, kind="JobCancelled", verdict="applied") == 1
    assert value(samples, folded, kind="JobCancelled", verdict="rejected") == 1
    assert value(samples, folded, kind="undecodable", verdict="undecodable") == 1
    assert value(samples, "evsched_jobs", queue="q1", status="scheduled") == 1
    assert value(samples, "evsched_jobs", queue="q1", status="cancelled") == 1
    assert value(samples, "evsched_jobs", queue="q1", status="running") == 0
    assert value(samples, "evsched_enqueue_latency_seconds_count") == 2
    assert value(samples, "evsched_applied_offset", partition="0") == 4
    assert value(samples, "evsched_consumer_lag_records", partition="0") == 0


async def test_lateness_expirations_and_stale_completions(api: Harness) -> None:
    job_id = await enqueue(api, queue="q")
    common = {"job_id": job_id, "emitted_at": 0, "token": 1}
    # The start is in time; its run lease of 0 ms has expired as soon as it is granted, so the
    # node's LeaseExpired applies (and the attempt counts: it started).
    await api.replica.append(
        JobLeased(event_id="l", source="node", attempt=1, lease_ms=60_000, **common)
    )
    await api.replica.append(
        AttemptStarted(event_id="s", source="w", worker_id="w", lease_ms=0, **common)
    )
    await api.replica.append(LeaseExpired(event_id="x", source="node", **common))
    await api.replica.append(AttemptSucceeded(event_id="ok", source="w", result=b"1", **common))
    samples = await scrape(api)
    assert value(samples, "evsched_start_lateness_seconds_count", queue="q") == 1
    assert value(samples, "evsched_lease_expirations_total", queue="q") == 1
    stale = value(samples, "evsched_stale_completions_total", queue="q", kind="AttemptSucceeded")
    assert stale == 1
    assert value(samples, "evsched_jobs", queue="q", status="scheduled") == 1
    assert value(samples, "evsched_jobs", queue="q", status="running") == 0


async def test_lag_is_cleared_when_the_broker_does_not_answer(api: Harness) -> None:
    await enqueue(api)
    assert ("evsched_consumer_lag_records", frozenset({("partition", "0")})) in await scrape(api)
    api.replica.lag_error = TimeoutError()
    samples = await scrape(api)
    assert not [key for key in samples if key[0] == "evsched_consumer_lag_records"]


async def test_counts_are_seeded_from_what_the_index_already_holds(tmp_path: Path) -> None:
    """An API restarted on a kept data dir counts the jobs its replica folded before."""
    async with Harness(tmp_path / "a") as first:
        for queue in ("q1", "q1", "q2"):
            await enqueue(first, queue=queue)
        log, replica = first.log, first.replica
    later = Harness(tmp_path / "a")
    later.log, later.replica = log, replica  # same log, same index directory
    async with later as api:
        stats = (await api.http.get("/v1/stats")).json()
        assert stats["by_queue"]["q1"]["by_status"]["scheduled"] == 2
        assert stats["total"] == 3
        await enqueue(api, queue="q2")
        stats = (await api.http.get("/v1/stats")).json()
        assert stats["by_queue"]["q2"]["total"] == 2


async def test_a_replica_hook_already_set_is_kept(tmp_path: Path) -> None:
    seen: list[FoldedEvent] = []
    harness = Harness(tmp_path)
    harness.replica.on_commit = seen.extend
    async with harness as api:
        await enqueue(api)
        assert [f.entry.kind for f in seen] == ["JobEnqueued"]
        assert value(await scrape(api), "evsched_jobs", queue="default", status="scheduled") == 1


def test_counts_ignore_moves_until_seeded() -> None:
    """Before the seed scan, a move would count a job the scan is about to count again."""
    counts = JobCounts()
    state = job_state("j", max_attempts=1, timeout_ms=1)
    counts.move(None, state)
    assert counts.snapshot() == {}
    assert counts.seed([]) == 0
    counts.move(None, state)
    counts.move(state, replace(state, status=Status.DEAD))
    assert counts.snapshot() == {("q", Status.DEAD): 1}
    assert counts.by_queue()["q"][Status.SCHEDULED] == 0


async def test_serve_metrics_exposes_the_registry_over_http() -> None:
    metrics = Metrics()
    metrics.enqueue_latency.observe(0.01)
    port = free_port()
    server = serve_metrics(metrics.registry, port)
    try:
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    finally:
        server.shutdown()
        server.server_close()
    assert value(parse(text), "evsched_enqueue_latency_seconds_count") == 1


async def test_the_projector_tells_its_hook_only_what_it_committed(tmp_path: Path) -> None:
    seen: list[list[FoldedEvent]] = []
    log = MemoryLog()
    app = App(SETTINGS, log_factory=lambda: log)
    await app.publish(JobCancelled(event_id="c", job_id="j", emitted_at=0, source="api"))
    await app.close()
    index = PartitionIndex(tmp_path / "p", 0)
    try:
        projector = Projector(index, on_commit=lambda events: seen.append(list(events)))
        records = [
            Record(w.topic, 0, w.offset, 1_000, w.key.encode(), w.value) for w in log.records
        ]
        folded = projector.fold(records)
        assert seen == []
        projector.commit(folded)
        [[only]] = seen
        assert (only.entry.kind, only.entry.verdict, only.before, only.after) == (
            "JobCancelled",
            Verdict.REJECTED,
            None,
            None,
        )
        projector.commit(projector.fold(records))  # nothing new: no call
        assert len(seen) == 1
    finally:
        index.close()
