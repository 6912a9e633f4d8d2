"""Hostile input at the API's edge (issue 9, E.15 and E.16): deep nesting, header and cursor
encodings; and reads that never fail for what the log holds."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evsched.adapters.index.poison import POISON_KEPT
from evsched.adapters.payload import MAX_JSON_DEPTH, NotJson, decode_args, deeper_than
from evsched.client import App
from evsched.core import ids
from evsched.core.events import AttemptStarted, AttemptSucceeded, JobEnqueued, JobLeased
from evsched.ports import Appended
from evsched.testing import MemoryLog
from tests.unit.api.test_api_twin import SETTINGS, Harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


def nested(depth: int) -> str:
    """A JSON array holding arrays ``depth`` levels deep in all."""
    return "[" * depth + "]" * depth


# --- E.15: deep nesting -------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["args", "kwargs"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 255])
async def test_args_nested_too_deep_are_422_naming_the_field(
    api: Harness, field: str, depth: int
) -> None:
    value = nested(depth) if field == "args" else '{"k":' + nested(depth - 1) + "}"
    body = f'{{"task":"t","{field}":{value}}}'
    response = await api.http.post(
        "/v1/jobs", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["field"] == field
    assert f"deeper than {MAX_JSON_DEPTH}" in error["message"]
    assert api.log.records == []


async def test_args_at_the_depth_limit_are_accepted_and_read_back(api: Harness) -> None:
    body = f'{{"task":"t","args":{nested(MAX_JSON_DEPTH)}}}'
    made = await api.http.post(
        "/v1/jobs", content=body, headers={"content-type": "application/json"}
    )
    assert made.status_code == 201, made.text
    read = await api.http.get(f"/v1/jobs/{made.json()['id']}")
    assert read.status_code == 200
    assert deeper_than(read.json()["args"], MAX_JSON_DEPTH - 1)


async def test_a_body_too_deep_to_parse_is_a_4xx_not_a_500(api: Harness) -> None:
    body = '{"task":"t","args":' + nested(100_000) + "}"
    response = await api.http.post(
        "/v1/jobs", content=body, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500
    assert api.log.records == []


@pytest.mark.parametrize("depth", [255, 5_000])
async def test_a_foreign_job_nested_deep_still_reads_and_lists(api: Harness, depth: int) -> None:
    """A producer other than the API may write any depth; reads must never 500 on it."""
    deep = ('{"args":' + nested(depth) + ',"kwargs":{}}').encode()
    await api.replica.append(
        JobEnqueued(
            event_id="e1",
            job_id="deep",
            emitted_at=0,
            source="foreign",
            task="t",
            queue="default",
            args=deep,
        )
    )
    common = {"job_id": "deep", "emitted_at": 0, "token": 1}
    await api.replica.append(
        JobLeased(event_id="l", source="node", attempt=1, lease_ms=9, **common)
    )
    await api.replica.append(
        AttemptStarted(event_id="s", source="w", worker_id="w", lease_ms=9_000, **common)
    )
    await api.replica.append(AttemptSucceeded(event_id="d", source="w", result=deep, **common))
    job = await api.http.get("/v1/jobs/deep")
    assert job.status_code == 200, job.text
    assert (job.json()["status"], job.json()["args"], job.json()["result"]) == (
        "succeeded",
        None,
        None,
    )
    listed = await api.http.get("/v1/jobs")
    assert listed.status_code == 200
    assert [j["id"] for j in listed.json()["jobs"]] == ["deep"]
    assert (await api.http.get("/v1/jobs/deep/timeline")).status_code == 200


def test_args_too_deep_to_parse_are_not_json_rather_than_a_crash() -> None:
    with pytest.raises(NotJson):
        decode_args(('{"args":' + nested(100_000) + "}").encode())
    assert not deeper_than([[1], {"a": [2]}], 3)
    assert deeper_than([[1], {"a": [[2]]}], 3)
    deep: list[object] = []
    for _ in range(10_000):
        deep = [deep]
    assert deeper_than(deep, 64)


# --- E.17: undecodable records ------------------------------------------------------------------


async def test_undecodable_records_are_listed_with_offset_size_and_reason(api: Harness) -> None:
    garbage = [b"\xc3\x01nope", b"", b"x" * 300]
    for value in garbage:
        await api.log.append(api.replica.topic, "k", value)
        await api.http.post("/v1/jobs", json={"task": "t"})
    listed = await api.http.get("/v1/undecodable")
    assert listed.status_code == 200, listed.text
    records = listed.json()["records"]
    assert [(r["partition"], r["offset"], r["size"]) for r in records] == [
        (0, 0, 6),
        (0, 2, 0),
        (0, 4, 300),
    ]
    assert all(r["reason"] for r in records)
    first = await api.http.get("/v1/undecodable", params={"limit": 2})
    assert [r["offset"] for r in first.json()["records"]] == [0, 2]
    rest = await api.http.get("/v1/undecodable", params={"cursor": first.json()["next_cursor"]})
    assert [r["offset"] for r in rest.json()["records"]] == [4]
    assert rest.json()["next_cursor"] is None
    other = await api.http.get("/v1/undecodable", params={"partition": 7})
    assert other.json()["records"] == []


async def test_a_cursor_past_a_record_trimmed_since_goes_on_with_the_oldest_kept(
    api: Harness,
) -> None:
    """The index keeps the newest POISON_KEPT (fold version 7): a page's cursor may name an
    offset that is gone by the next request; the next page starts at the oldest one kept."""
    for _ in range(3):
        await api.log.append(api.replica.topic, "k", b"\x00garbage")
    await api.http.post("/v1/jobs", json={"task": "t"})  # offset 3; waits for the replica
    first = await api.http.get("/v1/undecodable", params={"limit": 2})
    assert [r["offset"] for r in first.json()["records"]] == [0, 1]
    for _ in range(POISON_KEPT):
        await api.log.append(api.replica.topic, "k", b"\x00garbage")
    await api.http.post("/v1/jobs", json={"task": "t"})
    rest = await api.http.get(
        "/v1/undecodable", params={"cursor": first.json()["next_cursor"], "limit": 3}
    )
    assert rest.status_code == 200, rest.text
    assert [r["offset"] for r in rest.json()["records"]] == [4, 5, 6]  # 0 to 2 were trimmed


# --- E.16: header and cursor encodings, a frozen broker -----------------------------------------


@pytest.mark.parametrize("key", ["clé-été", "注文-42", "emoji-🙂"])
async def test_a_non_ascii_idempotency_key_makes_the_python_clients_job_id(
    api: Harness, key: str
) -> None:
    """Header bytes are UTF-8 (HTTP hands them over as latin-1): the same key, the same job."""
    response = await api.http.post(
        "/v1/jobs",
        json={"task": "t", "queue": "mail"},
        headers=[("Idempotency-Key", key.encode())],
    )
    assert response.status_code == 201, response.text
    assert response.json()["id"] == ids.job_id_for_key("mail", key)
    assert response.json()["idempotency_key"] == key
    client = App(SETTINGS, log_factory=lambda: api.log)

    @client.task(name="t", queue="mail")
    def t() -> None: ...

    same = await t.options(idempotency_key=key).enqueue()
    assert same == response.json()["id"]


async def test_an_idempotency_key_that_is_not_utf8_is_422(api: Harness) -> None:
    response = await api.http.post(
        "/v1/jobs", json={"task": "t"}, headers=[("Idempotency-Key", b"caf\xe9")]
    )
    assert response.status_code == 422
    assert response.json()["error"]["field"] == "Idempotency-Key"
    assert api.log.records == []


@pytest.mark.parametrize("path", ["/v1/jobs", "/v1/schedules", "/v1/undecodable"])
async def test_a_cursor_with_a_lone_surrogate_is_422(api: Harness, path: str) -> None:
    await api.http.post("/v1/jobs", json={"task": "t"})
    raw = json.dumps([0, "\ud800"]).encode()  # valid JSON: "\\ud800" escaped
    cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    response = await api.http.get(path, params={"cursor": cursor})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "cursor"


class FrozenLog(MemoryLog):
    """A broker that takes writes and never acknowledges them (frozen), until thawed."""

    def __init__(self) -> None:
        super().__init__()
        self.thawed = asyncio.Event()

    async def append(self, topic: str, key: str, value: bytes) -> Appended:
        await self.thawed.wait()
        return await super().append(topic, key, value)


async def test_writes_to_a_frozen_broker_answer_202_unconfirmed_within_the_bound(
    tmp_path: Path,
) -> None:
    log = FrozenLog()
    client = App(SETTINGS, log_factory=lambda: log)
    async with Harness(tmp_path, app=client, wait_timeout_s=0.3) as api:
        api.log = log
        api.replica.log = log
        started = time.monotonic()
        response = await asyncio.wait_for(
            api.http.post("/v1/jobs", json={"task": "t"}, headers={"Idempotency-Key": "k1"}),
            timeout=10,
        )
        assert time.monotonic() - started < 5
        assert response.status_code == 202, response.text
        accepted = response.json()
        assert accepted["id"] == ids.job_id_for_key("default", "k1")
        assert (accepted["status"], accepted["partition"], accepted["offset"]) == (
            "unconfirmed",
            None,
            None,
        )
        assert response.headers["location"] == f"/v1/jobs/{accepted['id']}"
        assert api.metrics.registry.get_sample_value("evsched_api_writes_unconfirmed_total") == 1
        # The send goes on: once the broker thaws, the job is written, and reads find it.
        log.thawed.set()
        deadline = time.monotonic() + 10
        while not log.records and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        found = await api.http.get(f"/v1/jobs/{accepted['id']}")
        assert found.status_code == 200


# --- D.13: declared queues ----------------------------------------------------------------------


async def test_an_undeclared_queue_is_a_422_and_nothing_is_written(api: Harness) -> None:
    response = await api.http.post("/v1/jobs", json={"task": "t", "queue": "made-up"})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("unknown_queue", "queue")
    assert "evsched kafka topics --queue made-up" in error["message"]
    schedule = await api.http.put(
        "/v1/schedules/s", json={"cron": "* * * * *", "task": "t", "queue": "made-up"}
    )
    assert schedule.status_code == 422
    assert schedule.json()["error"]["code"] == "unknown_queue"
    assert api.log.records == []
    declared = await api.http.post("/v1/jobs", json={"task": "t", "queue": "mail"})
    assert declared.status_code == 201
    assert api.metrics.registry.get_sample_value("evsched_api_unknown_queue_refusals_total") == 2


async def test_a_405_allows_every_method_of_the_path(api: Harness) -> None:
    response = await api.http.post("/v1/schedules/s")
    assert response.status_code == 405
    assert response.headers["allow"] == "DELETE, GET, PUT"
    assert (await api.http.delete("/v1/jobs")).headers["allow"] == "GET, POST"
