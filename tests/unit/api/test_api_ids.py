"""Every route that takes a job or schedule id takes every id the fold takes (issue 32): up to
``MAX_ID_BYTES`` UTF-8 bytes, whatever their number of characters; a longer one is a 422 naming
the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from evsched.core.bounds import MAX_ID_BYTES
from tests.unit.api.test_api_twin import Harness, foreign_job

LONGEST = "x" * MAX_ID_BYTES
LONGEST_UTF8 = "é" * (MAX_ID_BYTES // 2)  # 512 characters, 1,024 bytes
LONGEST_EMOJI = "😀" * (MAX_ID_BYTES // 4)  # 256 characters, 1,024 bytes
FITTING = (LONGEST, LONGEST_UTF8, LONGEST_EMOJI)
TOO_LONG = (
    "x" * (MAX_ID_BYTES + 1),
    LONGEST_UTF8 + "a",  # 513 characters, 1,025 bytes
    LONGEST_EMOJI + "a",  # 257 characters, 1,025 bytes
)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


def test_the_ids_sit_on_the_bound() -> None:
    assert {len(i.encode()) for i in FITTING} == {MAX_ID_BYTES}
    assert {len(i.encode()) for i in TOO_LONG} == {MAX_ID_BYTES + 1}


async def job_routes(h: Harness, job_id: str) -> dict[str, httpx.Response]:
    path = f"/v1/jobs/{quote(job_id, safe='')}"
    return {
        "get": await h.http.get(path),
        "timeline": await h.http.get(f"{path}/timeline"),
        "workflow": await h.http.get(f"{path}/workflow"),
        "cancel": await h.http.post(f"{path}/cancel", json={}),
        "requeue": await h.http.post(f"{path}/requeue", json={}),
        "workflow cancel": await h.http.post(f"{path}/workflow/cancel", json={}),
        "workflow requeue": await h.http.post(f"{path}/workflow/requeue", json={}),
        "dashboard": await h.http.get(f"/jobs/{quote(job_id, safe='')}"),
    }


@pytest.mark.parametrize("job_id", FITTING, ids=["ascii", "utf8", "emoji"])
async def test_a_job_with_the_longest_id_is_read_and_acted_on(api: Harness, job_id: str) -> None:
    await foreign_job(api, job_id)
    answers = await job_routes(api, job_id)
    assert {name: r.status_code for name, r in answers.items()} == {
        "get": 200,
        "timeline": 200,
        "workflow": 200,
        "cancel": 200,
        "requeue": 200,
        "workflow cancel": 200,
        "workflow requeue": 200,
        "dashboard": 200,
    }
    assert answers["get"].json()["id"] == job_id
    assert api.replica.index(0).job(job_id).status.value == "scheduled"  # type: ignore[union-attr]


@pytest.mark.parametrize("job_id", TOO_LONG, ids=["ascii", "utf8", "emoji"])
async def test_a_longer_job_id_is_a_422_naming_the_field(api: Harness, job_id: str) -> None:
    for name, answer in (await job_routes(api, job_id)).items():
        assert answer.status_code == 422, (name, answer.text)
        error = answer.json()["error"]
        assert error["field"] == "job_id", name
        assert "1024" in error["message"], (name, error["message"])
    assert api.log.records == []


async def schedule_routes(h: Harness, schedule_id: str) -> dict[str, httpx.Response]:
    path = f"/v1/schedules/{quote(schedule_id, safe='')}"
    body = {"cron": "0 3 * * *", "task": "t"}
    return {
        "put": await h.http.put(path, json=body),
        "get": await h.http.get(path),
        "timeline": await h.http.get(f"{path}/timeline"),
        "pause": await h.http.post(f"{path}/pause", json={}),
        "resume": await h.http.post(f"{path}/resume", json={}),
        "delete": await h.http.delete(path),
    }


@pytest.mark.parametrize("schedule_id", FITTING, ids=["ascii", "utf8", "emoji"])
async def test_a_schedule_with_the_longest_id_goes_through_every_route(
    api: Harness, schedule_id: str
) -> None:
    answers = await schedule_routes(api, schedule_id)
    assert {name: r.status_code for name, r in answers.items()} == {
        "put": 201,
        "get": 200,
        "timeline": 200,
        "pause": 200,
        "resume": 200,
        "delete": 204,
    }
    assert answers["get"].json()["id"] == schedule_id


@pytest.mark.parametrize("schedule_id", TOO_LONG, ids=["ascii", "utf8", "emoji"])
async def test_a_longer_schedule_id_is_a_422_naming_the_field(
    api: Harness, schedule_id: str
) -> None:
    for name, answer in (await schedule_routes(api, schedule_id)).items():
        assert answer.status_code == 422, (name, answer.text)
        assert answer.json()["error"]["field"] == "schedule_id", name
    assert api.log.records == []


async def test_parents_are_ids_the_fold_takes(api: Harness) -> None:
    await foreign_job(api, LONGEST_UTF8)
    child = await api.http.post("/v1/jobs", json={"task": "t", "after": [LONGEST_UTF8]})
    assert child.status_code == 201, child.text
    assert child.json()["after"] == [LONGEST_UTF8]
    refused = await api.http.post("/v1/jobs", json={"task": "t", "after": [TOO_LONG[1]]})
    assert refused.status_code == 422
    assert refused.json()["error"]["field"] == "after.0"


async def test_the_dashboard_finds_and_acts_on_the_longest_id(api: Harness) -> None:
    await foreign_job(api, LONGEST_EMOJI)
    found = await api.http.get("/jobs", params={"find": LONGEST_EMOJI})
    assert found.status_code == 303
    assert found.headers["location"] == f"/jobs/{quote(LONGEST_EMOJI, safe='')}"
    page = await api.http.get(found.headers["location"])
    assert page.status_code == 200
    schedule = f"/schedules/{quote(TOO_LONG[2], safe='')}/delete"
    assert (await api.http.post(schedule, data={"csrf": "x"})).status_code == 422
