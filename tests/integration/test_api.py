"""The HTTP API on the real broker: a real node and worker process, the API in-process over a real
Replica, spoken to through httpx's ASGI transport.

Every write answers only once the broker acknowledged it and the API's replica applied it, so
the assertions right after a write need no waiting; what nodes and workers do later is waited
for with deadlines.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Stack, wait_for
from tests.prometheus import parse, value

from evsched.adapters.kafka.topics import ensure_topics
from evsched.api import create_app
from evsched.client import App
from evsched.metrics import Metrics
from evsched.runtime.replica import Replica

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="module")]

TOKEN = "integration-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Api:
    stack: Stack
    http: httpx.AsyncClient

    async def enqueue(self, expect: int = 201, **body: Any) -> dict[str, Any]:
        headers = dict(AUTH)
        if "key" in body:
            headers["Idempotency-Key"] = body.pop("key")
        response = await self.http.post("/v1/jobs", json=body, headers=headers)
        assert response.status_code == expect, response.text
        job: dict[str, Any] = response.json()
        return job

    async def wait_status(self, job_id: str, *statuses: str) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            job: dict[str, Any] = (await self.http.get(f"/v1/jobs/{job_id}")).json()
            return job if job.get("status") in statuses else None

        return await wait_for(probe, what=f"job {job_id} to be one of {statuses}")

    async def timeline(self, job_id: str) -> list[tuple[str, str, str]]:
        events = (await self.http.get(f"/v1/jobs/{job_id}/timeline")).json()["events"]
        return [(e["kind"], e["verdict"], e["source"]) for e in events]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def api(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Api]:
    namespace = unique_name("api")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    stack = Stack(kafka_bootstrap, namespace, tmp_path_factory.mktemp("api"))
    stack.start_node("node-1", "--dispatch-timeout-s", "5")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "8")
    metrics = Metrics()
    replica = Replica(stack.settings, stack.tmp / "api-replica", on_commit=metrics.observe_commit)
    client = App(stack.settings, name="api-test")
    await replica.start()
    app = create_app(stack.settings, replica=replica, app=client, token=TOKEN, metrics=metrics)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
    try:
        yield Api(stack, http)
        await stack.check(all_terminal=False)
    finally:
        await http.aclose()
        await client.close()
        await replica.stop()
        await stack.close()


async def test_enqueue_is_201_then_the_job_runs_to_success(api: Api) -> None:
    job = await api.enqueue(task="s.noop")
    assert job["status"] == "scheduled"
    done = await api.wait_status(job["id"], "succeeded")
    assert (done["attempt"], done["token"]) == (1, 1)
    assert [(k, v) for k, v, _ in await api.timeline(job["id"]) if v == "applied"] == [
        ("JobEnqueued", "applied"),
        ("JobLeased", "applied"),
        ("AttemptStarted", "applied"),
        ("AttemptSucceeded", "applied"),
    ]
    sources = [s for _, _, s in await api.timeline(job["id"])]
    assert sources[0] == "api" and sources[1] == "node-node-1"


async def test_idempotency_key_same_body_200_other_body_409(api: Api) -> None:
    first = await api.enqueue(task="s.effect", args=["k1"], key="api-k1")
    again = await api.enqueue(200, task="s.effect", args=["k1"], key="api-k1")
    assert again["id"] == first["id"]
    response = await api.http.post(
        "/v1/jobs",
        json={"task": "s.effect", "args": ["other"]},
        headers=AUTH | {"Idempotency-Key": "api-k1"},
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_conflict"
    await api.wait_status(first["id"], "succeeded")
    verdicts = [(k, v) for k, v, _ in await api.timeline(first["id"]) if k == "JobEnqueued"]
    assert verdicts == [
        ("JobEnqueued", "applied"),
        ("JobEnqueued", "duplicate"),
        ("JobEnqueued", "conflict"),
    ]


async def test_cancel_a_delayed_job(api: Api) -> None:
    job = await api.enqueue(task="s.noop", delay_s=600)
    cancelled = await api.http.post(
        f"/v1/jobs/{job['id']}/cancel", json={"reason": "not needed"}, headers=AUTH
    )
    assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")
    again = await api.http.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH)
    assert again.status_code == 409
    assert again.json()["error"]["message"] == "cannot cancel: job is already cancelled"


async def test_requeue_from_dead(api: Api) -> None:
    job = await api.enqueue(task="s.always_fail", max_attempts=1)
    dead = await api.wait_status(job["id"], "dead")
    assert dead["last_error"]["type"] == "ConnectionError"
    requeued = await api.http.post(
        f"/v1/jobs/{job['id']}/requeue", json={"reason": "retry by hand"}, headers=AUTH
    )
    assert requeued.status_code == 200
    # The job as the replica holds it once the requeue applied: a node may have leased it again
    # by then (a fresh token), but never is it the old dead job.
    body = requeued.json()
    assert (body["status"], body["attempt"]) == ("scheduled", 0) or body["token"] == 2
    again = await api.wait_status(job["id"], "dead")
    assert again["token"] == 2
    kinds = [(k, v) for k, v, _ in await api.timeline(job["id"])]
    assert ("JobRequeued", "applied") in kinds
    assert kinds.count(("AttemptFailed", "applied")) == 2


async def test_writes_need_the_bearer_token(api: Api) -> None:
    bare = await api.http.post("/v1/jobs", json={"task": "s.noop"})
    assert bare.status_code == 401
    wrong = await api.http.post(
        "/v1/jobs", json={"task": "s.noop"}, headers={"Authorization": "Bearer no"}
    )
    assert wrong.status_code == 403
    assert (await api.http.get("/v1/jobs", params={"limit": 1})).status_code == 200


async def test_schedules_round_trip(api: Api) -> None:
    body = {"cron": "0 3 * * *", "timezone": "Europe/Paris", "task": "s.noop"}
    created = await api.http.put("/v1/schedules/nightly", json=body, headers=AUTH)
    assert created.status_code == 201, created.text
    assert (await api.http.get("/v1/schedules/nightly")).json()["timezone"] == "Europe/Paris"
    assert (await api.http.delete("/v1/schedules/nightly", headers=AUTH)).status_code == 204
    assert (await api.http.get("/v1/schedules/nightly")).status_code == 404


async def test_stats_readiness_and_metrics(api: Api) -> None:
    job = await api.enqueue(task="s.noop")
    await api.wait_status(job["id"], "succeeded")
    stats = (await api.http.get("/v1/stats")).json()
    assert stats["by_queue"]["default"]["by_status"]["succeeded"] >= 1
    assert stats["total"] == sum(stats["by_status"].values())
    assert len(stats["partitions"]) == 3

    async def ready() -> dict[str, Any] | None:
        response = await api.http.get("/readyz")
        return response.json() if response.status_code == 200 else None

    assert set((await wait_for(ready, what="a ready API"))["lag"]) == {"0", "1", "2"}
    response = await api.http.get("/metrics")
    samples = parse(response.text)
    names = {name for name, _ in samples}
    for name in (
        "evsched_events_folded_total",
        "evsched_jobs",
        "evsched_enqueue_latency_seconds_count",
        "evsched_start_lateness_seconds_count",
        "evsched_consumer_lag_records",
        "evsched_applied_offset",
    ):
        assert name in names, name
    leased = value(samples, "evsched_events_folded_total", kind="JobLeased", verdict="applied")
    assert leased >= 1
    assert value(samples, "evsched_start_lateness_seconds_count", queue="default") >= 1
