"""The control endpoints over the in-memory twins: batches with per-job verdicts (atomic or not),
a POST that sets a retry policy, and pause / resume of queues and schedules."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from evsched.client import App
from evsched.core.events import JobEnqueued, QueuePaused
from evsched.errors import PublishError
from evsched.ports import Appended, Outbound
from evsched.testing import MemoryLog
from tests.unit.api.test_api_twin import SETTINGS, Harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


async def batch(api: Harness, jobs: list[dict[str, Any]], **options: Any) -> dict[str, Any]:
    response = await api.http.post("/v1/jobs:batch", json={"jobs": jobs, **options})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_a_batch_answers_a_verdict_per_job_in_order(api: Harness) -> None:
    first = await batch(api, [{"task": "t.run", "args": [0], "idempotency_key": "k"}])
    assert first["results"][0]["outcome"] == "accepted" and first["written"] == 1
    jobs = [
        {"task": "t.run", "args": [1]},
        {"task": "t.run", "args": [0], "idempotency_key": "k"},  # same key and body: duplicate
        {"task": "t.run", "args": [9], "idempotency_key": "k"},  # same key, other body
        {"task": "t.run", "queue": "nope"},  # undeclared queue
        {"task": "t.run", "args": [2], "priority": 5},
    ]
    body = await batch(api, jobs)
    outcomes = [(r["index"], r["outcome"], r["field"]) for r in body["results"]]
    assert outcomes == [
        (0, "accepted", None),
        (1, "duplicate", None),
        (2, "conflict", "idempotency_key"),
        (3, "invalid", "queue"),
        (4, "accepted", None),
    ]
    # The duplicate was written and judged by the fold; the conflict with an earlier job of the
    # same batch was refused before writing.
    assert body["written"] == 3
    assert len(api.log.events(JobEnqueued)) == 4


async def test_an_atomic_batch_with_a_refused_job_writes_nothing(api: Harness) -> None:
    jobs = [{"task": "t.run", "args": [1]}, {"task": "t.run", "max_attempts": 0}]
    response = await api.http.post("/v1/jobs:batch", json={"jobs": jobs, "atomic": True})
    assert response.status_code == 422  # the body itself is checked before anything
    jobs[1] = {"task": "t.run", "queue": "nope"}
    body = await batch(api, jobs, atomic=True)
    assert [r["outcome"] for r in body["results"]] == ["failed", "invalid"]
    assert body["written"] == 0 and api.log.events(JobEnqueued) == []
    body = await batch(api, jobs[:1] * 3, atomic=True)
    assert [r["outcome"] for r in body["results"]] == ["accepted"] * 3 and body["written"] == 3


async def test_a_post_sets_the_retry_policy(api: Harness) -> None:
    retry = {"initial_backoff_ms": 50, "max_backoff_ms": 500, "multiplier": 3.0, "jitter": 0.0}
    response = await api.http.post("/v1/jobs", json={"task": "t.run", "retry": retry})
    assert response.status_code == 201, response.text
    assert response.json()["retry"] == retry
    bad = await api.http.post("/v1/jobs", json={"task": "t.run", "retry": {"jitter": 2}})
    assert bad.status_code == 422 and "retry" in bad.text


async def test_a_queue_pause_and_resume_reach_the_partition(api: Harness) -> None:
    response = await api.http.post("/v1/queues/mail/pause", json={"reason": "maintenance"})
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["paused"] and view["partitions"][0]["reason"] == "maintenance"
    assert [e.queue for e in api.log.events(QueuePaused)] == ["mail"]
    again = await api.http.post("/v1/queues/mail/pause", json={})
    assert again.json()["paused"]  # already paused: rejected by the fold, state unchanged
    resumed = await api.http.post("/v1/queues/mail/resume", json={})
    assert resumed.status_code == 200 and not resumed.json()["paused"]
    assert not (await api.http.get("/v1/queues/mail")).json()["paused"]
    bad = await api.http.post("/v1/queues/bad%20name/pause", json={})
    assert bad.status_code == 422


async def test_the_declared_queues_are_listed_with_their_pause(api: Harness) -> None:
    await api.http.post("/v1/queues/mail/pause", json={"reason": "maintenance"})
    response = await api.http.get("/v1/queues")
    assert response.status_code == 200, response.text
    listed = {q["queue"]: q["paused"] for q in response.json()["queues"]}
    assert list(listed) == ["default", "mail", "q", "q1", "q2"]  # every declared queue, sorted
    assert [name for name, paused in listed.items() if paused] == ["mail"]


async def test_a_schedule_pause_and_resume(api: Harness) -> None:
    missing = await api.http.post("/v1/schedules/nightly/pause", json={})
    assert missing.status_code == 404
    created = await api.http.put(
        "/v1/schedules/nightly", json={"cron": "0 3 * * *", "task": "t.run"}
    )
    assert created.status_code == 201, created.text
    paused = await api.http.post("/v1/schedules/nightly/pause", json={"reason": "holiday"})
    assert paused.status_code == 200 and paused.json()["paused"]
    twice = await api.http.post("/v1/schedules/nightly/pause", json={})
    assert twice.status_code == 409
    resumed = await api.http.post("/v1/schedules/nightly/resume", json={})
    assert resumed.status_code == 200 and not resumed.json()["paused"]
    timeline = (await api.http.get("/v1/schedules/nightly/timeline")).json()["events"]
    assert [e["kind"] for e in timeline][-3:] == [
        "SchedulePaused",
        "SchedulePaused",
        "ScheduleResumed",
    ]


# --- one timeout bounds a whole write ------------------------------------------------------------


async def test_a_stalled_replica_holds_a_batch_one_timeout_not_one_per_job(
    tmp_path: Path,
) -> None:
    async with Harness(tmp_path, wait_timeout_s=0.2) as api:

        async def stalled(partition: int, offset: int, timeout_s: float = 10.0) -> None:
            await asyncio.sleep(timeout_s)
            raise TimeoutError

        api.replica.wait_for = stalled  # type: ignore[method-assign]
        started = time.monotonic()
        body = await batch(api, [{"task": "t.run", "args": [n]} for n in range(20)])
        assert time.monotonic() - started < 2.0  # a wait per job would take 4 s
        assert body["written"] == 20
        assert all("not yet applied here" in r["message"] for r in body["results"])


class FrozenManyLog(MemoryLog):
    """A broker that never acknowledges a write of many records until thawed."""

    def __init__(self) -> None:
        super().__init__()
        self.thawed = asyncio.Event()

    async def append_many(
        self, topic: str, records: Sequence[Outbound]
    ) -> list[Appended | PublishError]:
        await self.thawed.wait()
        return await super().append_many(topic, records)


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/jobs:batch", {"jobs": [{"task": "t.run"}]}), ("/v1/queues/mail/pause", {})],
)
async def test_a_batch_or_a_queue_control_to_a_frozen_broker_is_202_unconfirmed(
    tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    log = FrozenManyLog()
    client = App(SETTINGS, log_factory=lambda: log)
    async with Harness(tmp_path, app=client, wait_timeout_s=0.2) as api:
        api.log = api.replica.log = log
        response = await asyncio.wait_for(api.http.post(path, json=body), timeout=5)
        assert response.status_code == 202, response.text
        assert response.json()["status"] == "unconfirmed"
        assert api.metrics.registry.get_sample_value("evsched_api_writes_unconfirmed_total") == 1
        log.thawed.set()
        deadline = time.monotonic() + 5
        while not log.records and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert log.records  # the send went on in the background
