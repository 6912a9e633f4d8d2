"""The API's side of issue 13 items 4, 5 and 10 over the in-memory twins: the long poll
``GET /v1/jobs/{id}?wait=``, reruns, and failure categories in jobs and the dead-letter listing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evsched.core.events import AttemptStarted, AttemptSucceeded, JobLeased
from tests.unit.api.test_api import enqueue, error_of, kill
from tests.unit.api.test_api_twin import Harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


async def succeed(api: Harness, job_id: str) -> None:
    common = {"job_id": job_id, "emitted_at": 0, "token": 1}
    await api.replica.append(
        JobLeased(event_id="l1", source="node-x", attempt=1, lease_ms=60_000, **common)
    )
    await api.replica.append(
        AttemptStarted(event_id="s1", source="worker-x", worker_id="w", lease_ms=60_000, **common)
    )
    await api.replica.append(
        AttemptSucceeded(event_id="ok", source="worker-x", result=b'{"n":1}', **common)
    )


async def test_the_long_poll_answers_once_the_job_is_finished(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    parked = asyncio.Event()  # set once the long poll waits on the replica
    waiting = api.replica.wait_for

    async def wait_for(partition: int, offset: int, timeout_s: float = 10.0) -> None:
        parked.set()
        await waiting(partition, offset, timeout_s)

    monkeypatch.setattr(api.replica, "wait_for", wait_for)
    job = await enqueue(api)
    polling = asyncio.create_task(api.http.get(f"/v1/jobs/{job['id']}", params={"wait": 10}))
    await asyncio.wait_for(parked.wait(), 10)
    assert not polling.done()
    await kill(api, job["id"])
    answer = await asyncio.wait_for(polling, 10)
    assert answer.status_code == 200
    body = answer.json()
    assert body["status"] == "dead"
    assert body["last_error"]["category"] == "permanent"


async def test_the_long_poll_gives_the_result_and_runs_out_with_the_job_as_it_is(
    api: Harness,
) -> None:
    job = await enqueue(api)
    pending = await api.http.get(f"/v1/jobs/{job['id']}", params={"wait": 0.2})
    assert (pending.status_code, pending.json()["status"]) == (200, "scheduled")
    await succeed(api, job["id"])
    done = await api.http.get(f"/v1/jobs/{job['id']}", params={"wait": 30})
    assert done.json()["result"] == {"n": 1}


@pytest.mark.parametrize("wait", ["soon", "-1", "61", "nan"])
async def test_a_bad_wait_is_422_naming_the_field(api: Harness, wait: str) -> None:
    job = await enqueue(api)
    response = await api.http.get(f"/v1/jobs/{job['id']}", params={"wait": wait})
    assert (response.status_code, error_of(response)["field"]) == (422, "wait")


async def test_a_succeeded_job_is_requeued_only_with_rerun(api: Harness) -> None:
    job = await enqueue(api)
    await succeed(api, job["id"])
    plain = await api.http.post(f"/v1/jobs/{job['id']}/requeue")
    assert plain.status_code == 409
    assert "needs rerun" in error_of(plain)["message"]
    again = await api.http.post(f"/v1/jobs/{job['id']}/requeue", json={"rerun": True})
    assert again.status_code == 200
    assert (again.json()["status"], again.json()["result"]) == ("scheduled", None)
    timeline = (await api.http.get(f"/v1/jobs/{job['id']}/timeline")).json()["events"]
    assert "rerun" in timeline[-1]["reason"]


async def test_the_dead_letter_listing_filters_by_category(api: Harness) -> None:
    job = await enqueue(api)
    await kill(api, job["id"])
    dead = await api.http.get("/v1/jobs", params={"status": "dead", "category": "permanent"})
    assert [j["id"] for j in dead.json()["jobs"]] == [job["id"]]
    none = await api.http.get("/v1/jobs", params={"status": "dead", "category": "timeout"})
    assert none.json()["jobs"] == []
