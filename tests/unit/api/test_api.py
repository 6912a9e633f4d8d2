"""The HTTP API over the in-memory twins: the real fold and index, no broker.

Writes, verdicts (applied, duplicate, conflict, rejected), reads, paging, errors and auth.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from evsched.client import App
from evsched.core import ids
from evsched.core.events import AttemptFailed, AttemptStarted, JobLeased
from tests.unit.api.test_api_twin import SETTINGS, TOKEN, Harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


@pytest.fixture
async def guarded(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path, token=TOKEN) as harness:
        yield harness


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"]), body
    detail: dict[str, Any] = body["error"]
    return detail


async def enqueue(api: Harness, **body: Any) -> dict[str, Any]:
    response = await api.http.post("/v1/jobs", json={"task": "t.run", **body})
    assert response.status_code == 201, response.text
    job: dict[str, Any] = response.json()
    return job


async def kill(api: Harness, job_id: str) -> None:
    """Make the job dead the way a node and a worker would: lease, start, permanent failure."""
    common = {"job_id": job_id, "emitted_at": 0, "token": 1}
    await api.replica.append(
        JobLeased(event_id="l1", source="node-x", attempt=1, lease_ms=60_000, **common)
    )
    await api.replica.append(
        AttemptStarted(event_id="s1", source="worker-x", worker_id="w", lease_ms=60_000, **common)
    )
    await api.replica.append(
        AttemptFailed(
            event_id="f1",
            source="worker-x",
            error_type="ValueError",
            message="no",
            retryable=False,
            **common,
        )
    )


# --- enqueue ------------------------------------------------------------------------------------


async def test_enqueue_answers_201_with_the_applied_job(api: Harness) -> None:
    response = await api.http.post(
        "/v1/jobs",
        json={"task": "t.run", "args": [1, "x"], "kwargs": {"k": [True]}, "labels": {"a": "b"}},
    )
    assert response.status_code == 201
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "scheduled"
    assert (job["task"], job["queue"], job["attempt"]) == ("t.run", "default", 0)
    assert (job["args"], job["kwargs"], job["labels"]) == ([1, "x"], {"k": [True]}, {"a": "b"})
    assert job["run_at"].endswith("Z")
    [event] = api.log.events()
    assert event.source == "api"


async def test_enqueue_options_reach_the_event(api: Harness) -> None:
    job = await enqueue(api, queue="mail", delay_s=3600, priority=7, max_attempts=9, timeout_s=2.5)
    assert (job["queue"], job["priority"], job["max_attempts"], job["timeout_s"]) == (
        "mail",
        7,
        9,
        2.5,
    )
    assert job["run_at"] > job["enqueued_at"]


async def test_same_key_and_body_is_the_same_job_with_200(api: Harness) -> None:
    headers = {"Idempotency-Key": "order-1"}
    first = await api.http.post("/v1/jobs", json={"task": "t.run", "args": [1]}, headers=headers)
    again = await api.http.post("/v1/jobs", json={"task": "t.run", "args": [1]}, headers=headers)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"] == ids.job_id_for_key("default", "order-1")
    assert "location" not in again.headers


async def test_same_key_other_body_is_a_409_and_changes_nothing(api: Harness) -> None:
    headers = {"Idempotency-Key": "order-2"}
    first = await api.http.post("/v1/jobs", json={"task": "t.run", "args": [1]}, headers=headers)
    other = await api.http.post("/v1/jobs", json={"task": "t.run", "args": [2]}, headers=headers)
    assert other.status_code == 409
    assert error_of(other)["code"] == "idempotency_conflict"
    assert error_of(other)["field"] == "Idempotency-Key"
    job = (await api.http.get(f"/v1/jobs/{first.json()['id']}")).json()
    assert job["args"] == [1]
    timeline = (await api.http.get(f"/v1/jobs/{job['id']}/timeline")).json()
    assert [e["verdict"] for e in timeline["events"]] == ["applied", "conflict"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "task"),
        ({"task": ""}, "task"),
        ({"task": "t", "surprise": 1}, "surprise"),
        ({"task": "t", "queue": "no spaces"}, "queue"),
        ({"task": "t", "delay_s": -1}, "delay_s"),
        ({"task": "t", "delay_s": 5, "run_at": "2030-01-01T00:00:00Z"}, "run_at"),
        ({"task": "t", "run_at": "2030-01-01T00:00:00"}, "run_at"),
        ({"task": "t", "run_at": "1990-01-01T00:00:00Z"}, "run_at"),
        ({"task": "t", "max_attempts": 0}, "max_attempts"),
        ({"task": "t", "args": {"not": "a list"}}, "args"),
        ({"task": "t", "labels": {"a": 1}}, "labels.a"),
        ('{"task": "t\\ud800"}', "task"),
        ('{"task": "t", "kwargs": {"k": ["\\udfff"]}}', "kwargs"),
        ('{"task": "t", "args": [NaN]}', "args"),
    ],
)
async def test_bad_enqueues_are_422_naming_the_field(
    api: Harness, body: dict[str, Any] | str, field: str
) -> None:
    if isinstance(body, str):  # JSON that only a raw body can carry: lone surrogates, NaN
        response = await api.http.post(
            "/v1/jobs", content=body.encode(), headers={"content-type": "application/json"}
        )
    else:
        response = await api.http.post("/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    error = error_of(response)
    assert error["code"] == "validation_error"
    assert error["field"] == field
    assert api.log.records == []


async def test_malformed_json_is_422(api: Harness) -> None:
    response = await api.http.post(
        "/v1/jobs", content=b"{", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "validation_error"
    assert error_of(response)["field"] is None  # a character position is not a field


async def test_a_bad_idempotency_key_is_422(api: Harness) -> None:
    response = await api.http.post(
        "/v1/jobs", json={"task": "t"}, headers={"Idempotency-Key": "k" * 513}
    )
    assert response.status_code == 422
    assert error_of(response)["field"] == "Idempotency-Key"


async def test_an_event_above_the_size_limit_is_422_on_args(api: Harness) -> None:
    response = await api.http.post("/v1/jobs", json={"task": "t", "args": ["x" * 950_000]})
    assert response.status_code == 422
    assert error_of(response)["field"] == "args"


async def test_bodies_above_the_limit_are_413(tmp_path: Path) -> None:
    async with Harness(tmp_path, max_body_bytes=2_048) as api:
        declared = await api.http.post("/v1/jobs", json={"task": "t", "args": ["x" * 4_096]})
        assert declared.status_code == 413
        assert error_of(declared)["code"] == "payload_too_large"

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"task": "t", "args": ["'
            for _ in range(8):
                yield b"x" * 1_000
            yield b'"]}'

        streamed = await api.http.post(
            "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413
        assert error_of(streamed)["code"] == "payload_too_large"
        assert api.log.records == []


async def test_broker_failure_is_503_and_nothing_is_claimed(api: Harness) -> None:
    api.log.fail_next()
    response = await api.http.post("/v1/jobs", json={"task": "t"})
    assert response.status_code == 503
    assert error_of(response)["code"] == "broker_unavailable"


async def test_a_write_the_replica_has_not_applied_in_time_is_202(api: Harness) -> None:
    api.replica.paused = True
    response = await api.http.post("/v1/jobs", json={"task": "t"})
    assert response.status_code == 202
    accepted = response.json()
    assert response.headers["location"] == f"/v1/jobs/{accepted['id']}"
    assert (accepted["status"], accepted["partition"], accepted["offset"]) == ("acknowledged", 0, 0)
    api.replica.paused = False
    assert (await api.http.get(f"/v1/jobs/{accepted['id']}")).status_code == 200


async def test_a_bug_of_ours_is_a_500_in_the_same_shape(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(partition: int) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(api.replica, "index", broken)
    transport = httpx.ASGITransport(app=api.api, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        response = await http.get("/v1/jobs/x")
    assert response.status_code == 500
    assert error_of(response) == {
        "code": "internal_error",
        "message": "internal error; see the API's log",
        "field": None,
    }


# --- tasks of an --app ----------------------------------------------------------------------------


async def test_a_defined_task_lends_its_defaults_and_checks(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    app = App(SETTINGS, log_factory=lambda: harness.log)

    @app.task(name="mail.send", queue="mail", max_attempts=5, priority=3)
    async def send(to: str) -> None:
        return None

    harness.client_app = app
    async with harness as api:
        job = await enqueue(api, task="mail.send", args=["a@b"])
        assert (job["queue"], job["max_attempts"], job["priority"]) == ("mail", 5, 3)
        wrong_args = await api.http.post("/v1/jobs", json={"task": "mail.send", "args": [1, 2]})
        assert error_of(wrong_args)["field"] == "args"
        wrong_queue = await api.http.post(
            "/v1/jobs", json={"task": "mail.send", "args": ["a"], "queue": "default"}
        )
        assert error_of(wrong_queue)["field"] == "queue"
        other = await enqueue(api, task="not.defined")
        assert other["queue"] == "default"


# --- reads ----------------------------------------------------------------------------------------


async def test_unknown_job_route_and_method_share_the_error_shape(api: Harness) -> None:
    missing = await api.http.get("/v1/jobs/nope")
    assert (missing.status_code, error_of(missing)["code"]) == (404, "not_found")
    no_route = await api.http.get("/v2/nothing")
    assert (no_route.status_code, error_of(no_route)["code"]) == (404, "not_found")
    wrong = await api.http.delete("/v1/jobs")
    assert (wrong.status_code, error_of(wrong)["code"]) == (405, "method_not_allowed")
    no_timeline = await api.http.get("/v1/jobs/nope/timeline")
    assert no_timeline.status_code == 404


async def test_timeline_lists_every_event_with_its_verdict(api: Harness) -> None:
    job = await enqueue(api)
    await api.http.post(f"/v1/jobs/{job['id']}/cancel", json={"reason": "changed my mind"})
    await api.http.post(f"/v1/jobs/{job['id']}/cancel")
    timeline = (await api.http.get(f"/v1/jobs/{job['id']}/timeline")).json()
    events = timeline["events"]
    assert [(e["kind"], e["verdict"]) for e in events] == [
        ("JobEnqueued", "applied"),
        ("JobCancelled", "applied"),
        ("JobCancelled", "rejected"),
    ]
    assert [e["offset"] for e in events] == [0, 1, 2]
    assert events[1]["reason"] == "cancelled by api: changed my mind"
    assert events[1]["status_after"] == "cancelled"
    assert all(e["source"] == "api" and e["partition"] == 0 for e in events)
    assert timeline["next_after"] is None


async def test_a_timeline_comes_a_page_at_a_time(api: Harness) -> None:
    job = await enqueue(api)
    for _ in range(3):
        await api.http.post(f"/v1/jobs/{job['id']}/cancel")
    path = f"/v1/jobs/{job['id']}/timeline"
    first = (await api.http.get(path, params={"limit": 3})).json()
    assert [e["offset"] for e in first["events"]] == [0, 1, 2]
    assert first["next_after"] == 2
    last = (await api.http.get(path, params={"limit": 3, "after": 2})).json()
    assert [e["offset"] for e in last["events"]] == [3]
    assert last["next_after"] is None
    past = await api.http.get(path, params={"after": 3})
    assert past.status_code == 200 and past.json()["events"] == []


async def test_listing_pages_through_every_job_once_in_a_stable_order(api: Harness) -> None:
    made = {(await enqueue(api, args=[i]))["id"] for i in range(7)}
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        page = (await api.http.get("/v1/jobs", params=params)).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == seen and set(seen) == made and len(seen) == 7


async def test_listing_filters_by_status_queue_and_task(api: Harness) -> None:
    a = await enqueue(api, task="t.a", queue="q1")
    b = await enqueue(api, task="t.b", queue="q2")
    await api.http.post(f"/v1/jobs/{b['id']}/cancel")

    async def ids_of(**params: Any) -> list[str]:
        return [j["id"] for j in (await api.http.get("/v1/jobs", params=params)).json()["jobs"]]

    assert await ids_of(status="cancelled") == [b["id"]]
    assert await ids_of(queue="q1") == [a["id"]]
    assert await ids_of(task="t.b", status="scheduled") == []
    bad = await api.http.get("/v1/jobs", params={"status": "sleeping"})
    assert (bad.status_code, error_of(bad)["field"]) == (422, "status")


async def test_a_selective_filter_reads_at_most_the_scan_budget_per_page(tmp_path: Path) -> None:
    async with Harness(tmp_path, max_scan=2) as api:
        for i in range(5):
            await enqueue(api, args=[i])
        pages = 0
        cursor: str | None = None
        while True:
            params = {"status": "dead"} | ({"cursor": cursor} if cursor else {})
            page = (await api.http.get("/v1/jobs", params=params)).json()
            assert page["jobs"] == [] and page["scanned"] <= 2
            pages += 1
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == 3


@pytest.mark.parametrize("cursor", ["@@@", "bnVsbA", "WyJ4IiwxXQ", "W10"])
async def test_a_forged_cursor_is_422(api: Harness, cursor: str) -> None:
    response = await api.http.get("/v1/jobs", params={"cursor": cursor})
    assert response.status_code == 422
    assert error_of(response)["field"] == "cursor"


# --- cancel and requeue ---------------------------------------------------------------------------


async def test_cancel_then_cancel_again_is_409_and_unknown_is_404(api: Harness) -> None:
    job = await enqueue(api, delay_s=600)
    cancelled = await api.http.post(f"/v1/jobs/{job['id']}/cancel")
    assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")
    again = await api.http.post(f"/v1/jobs/{job['id']}/cancel")
    assert again.status_code == 409
    assert error_of(again) == {
        "code": "transition_rejected",
        "message": "cannot cancel: job is already cancelled",
        "field": None,
    }
    unknown = await api.http.post("/v1/jobs/nope/cancel")
    assert unknown.status_code == 404
    assert len(api.log.records) == 3  # nothing written for the unknown job


async def test_requeue_a_dead_job_gives_it_a_fresh_budget(api: Harness) -> None:
    job = await enqueue(api)
    early = await api.http.post(f"/v1/jobs/{job['id']}/requeue")
    assert (early.status_code, error_of(early)["code"]) == (409, "transition_rejected")
    await kill(api, job["id"])
    assert (await api.http.get(f"/v1/jobs/{job['id']}")).json()["status"] == "dead"
    requeued = await api.http.post(
        f"/v1/jobs/{job['id']}/requeue", json={"reason": "fixed", "delay_s": 60}
    )
    assert requeued.status_code == 200
    state = requeued.json()
    assert (state["status"], state["attempt"], state["token"]) == ("scheduled", 0, 1)
    assert state["last_error"] == {
        "type": "ValueError",
        "message": "no",
        "retryable": False,
        "category": "permanent",
        "traceback": None,
    }
    assert state["run_at"] > state["enqueued_at"]


async def test_requeue_checks_its_body(api: Harness) -> None:
    job = await enqueue(api)
    both = await api.http.post(
        f"/v1/jobs/{job['id']}/requeue", json={"delay_s": 1, "run_at": "2031-01-01T00:00:00Z"}
    )
    assert (both.status_code, error_of(both)["field"]) == (422, "run_at")


# --- auth -----------------------------------------------------------------------------------------


async def test_writes_need_the_token_and_reads_do_not(guarded: Harness) -> None:
    bare = await guarded.http.post("/v1/jobs", json={"task": "t"})
    assert (bare.status_code, error_of(bare)["code"]) == (401, "unauthorized")
    assert bare.headers["www-authenticate"] == "Bearer"
    wrong = await guarded.http.post(
        "/v1/jobs", json={"task": "t"}, headers={"Authorization": "Bearer nope"}
    )
    assert (wrong.status_code, error_of(wrong)["code"]) == (403, "forbidden")
    basic = await guarded.http.post(
        "/v1/jobs", json={"task": "t"}, headers={"Authorization": "Basic dTpw"}
    )
    assert basic.status_code == 401
    assert guarded.log.records == []
    ok = await guarded.http.post("/v1/jobs", json={"task": "t"}, headers=guarded.auth())
    assert ok.status_code == 201
    for path in (f"/v1/jobs/{ok.json()['id']}", "/v1/jobs", "/v1/stats", "/metrics", "/readyz"):
        assert (await guarded.http.get(path)).status_code == 200, path
    for path in ("/cancel", "/requeue"):
        denied = await guarded.http.post(f"/v1/jobs/{ok.json()['id']}{path}")
        assert denied.status_code == 401
    put = await guarded.http.put("/v1/schedules/s", json={"cron": "* * * * *", "task": "t"})
    assert put.status_code == 401
    assert (await guarded.http.delete("/v1/schedules/s")).status_code == 401


# --- schedules ------------------------------------------------------------------------------------


async def test_schedule_create_replace_read_list_delete(api: Harness) -> None:
    body = {"cron": "*/5 * * * *", "timezone": "Europe/Paris", "task": "t.tick", "args": [1]}
    created = await api.http.put("/v1/schedules/tick", json=body)
    assert created.status_code == 201
    schedule = created.json()
    assert (schedule["cron"], schedule["timezone"], schedule["args"]) == (
        "*/5 * * * *",
        "Europe/Paris",
        [1],
    )
    assert schedule["next_fire_at"] is not None
    replaced = await api.http.put("/v1/schedules/tick", json=body | {"cron": "0 * * * *"})
    assert (replaced.status_code, replaced.json()["cron"]) == (200, "0 * * * *")
    assert (await api.http.get("/v1/schedules/tick")).json()["cron"] == "0 * * * *"
    listed = (await api.http.get("/v1/schedules")).json()
    assert [s["id"] for s in listed["schedules"]] == ["tick"]
    assert (await api.http.delete("/v1/schedules/tick")).status_code == 204
    assert (await api.http.get("/v1/schedules/tick")).status_code == 404
    assert (await api.http.delete("/v1/schedules/tick")).status_code == 404
    assert (await api.http.get("/v1/schedules")).json()["schedules"] == []
    history = (await api.http.get("/v1/schedules/tick/timeline")).json()["events"]
    assert [e["kind"] for e in history] == [
        "ScheduleUpserted",
        "ScheduleUpserted",
        "ScheduleDeleted",
    ]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "not cron"}, "cron"),
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "0 0 30 2 *"}, "cron"),
    ],
)
async def test_bad_schedules_are_422_naming_the_field(
    api: Harness, change: dict[str, str], field: str
) -> None:
    body = {"cron": "* * * * *", "task": "t"} | change
    response = await api.http.put("/v1/schedules/bad", json=body)
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == field


# --- health, readiness, stats ---------------------------------------------------------------------


async def test_health_and_readiness(api: Harness) -> None:
    assert (await api.http.get("/healthz")).json() == {"status": "ok"}
    assert (await api.http.get("/readyz")).json() == {"status": "ready", "lag": {"0": 0}}
    api.replica.paused = True
    await api.log.append(api.replica.topic, "k", b"bytes")
    ready = (await api.http.get("/readyz")).json()
    assert ready["lag"] == {"0": 1}  # within the default allowance


async def test_not_ready_when_behind_or_broker_silent(tmp_path: Path) -> None:
    async with Harness(tmp_path, ready_max_lag=0) as api:
        api.replica.paused = True
        await api.log.append(api.replica.topic, "k", b"bytes")
        behind = await api.http.get("/readyz")
        assert (behind.status_code, error_of(behind)["code"]) == (503, "not_ready")
        api.replica.paused = False
        api.replica.lag_error = TimeoutError()
        assert (await api.http.get("/readyz")).status_code == 503
        api.replica.lag_error = None
        assert (await api.http.get("/readyz")).status_code == 200
        await api.replica.stop()
        assert (await api.http.get("/readyz")).status_code == 503
        await api.replica.start()


async def test_not_ready_while_a_partition_fails_to_fold(api: Harness) -> None:
    # Replica.failing: the partition is paused and retried, its reads are stale meanwhile.
    api.replica.failing[2] = "fold failed at offset 7: OverflowError('index key')" + "x" * 500
    failing = await api.http.get("/readyz")
    assert (failing.status_code, error_of(failing)["code"]) == (503, "not_ready")
    message = error_of(failing)["message"]
    assert "partition 2: fold failed at offset 7: OverflowError('index key')" in message
    assert len(message) < 300  # the reason is cut short, not a record's content
    api.replica.failing.clear()  # recovered
    assert (await api.http.get("/readyz")).status_code == 200


async def test_stats_count_jobs_by_status_and_queue(api: Harness) -> None:
    await enqueue(api, queue="q1")
    b = await enqueue(api, queue="q2")
    await enqueue(api, queue="q2")
    await api.http.post(f"/v1/jobs/{b['id']}/cancel")
    stats = (await api.http.get("/v1/stats")).json()
    assert stats["total"] == 3
    assert stats["by_status"]["scheduled"] == 2 and stats["by_status"]["cancelled"] == 1
    assert stats["by_queue"]["q2"]["by_status"]["cancelled"] == 1
    assert stats["by_queue"]["q1"]["total"] == 1
    assert stats["partitions"] == [{"partition": 0, "applied_offset": 3}]
