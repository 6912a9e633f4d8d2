"""Hostile input at the API's edge (issue 9, E.15 and E.16): deep nesting, header and cursor
encodings; and reads that never fail for what the log holds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evsched.client.payload import MAX_JSON_DEPTH, NotJson, decode_args, deeper_than
from evsched.core.events import AttemptStarted, AttemptSucceeded, JobEnqueued, JobLeased
from tests.unit.test_api_twin import Harness


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
