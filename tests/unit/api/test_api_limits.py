"""The limit endpoints over the in-memory twins: a queue's and a key's limits are written to
every partition and read back from the home; bad bodies are 4xx naming the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evsched.core.events import KeyLimitSet, QueueLimitSet
from tests.unit.api.test_api_twin import Harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


async def test_a_queue_limit_is_set_everywhere_and_read_from_its_home(api: Harness) -> None:
    body = {"max_running": 2, "rate_starts": 10, "rate_per_ms": 1_000, "reason": "api quota"}
    response = await api.http.put("/v1/queues/default/limit", json=body)
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["max_running"] == 2 and view["rate_starts"] == 10 and view["rate_per_ms"] == 1_000
    assert view["holders"] == [] and view["waiting"] == 0
    written = api.log.events(QueueLimitSet)
    assert view["partitions_set"] == len(written) >= 1
    again = await api.http.get("/v1/queues/default/limit")
    assert again.json() == view
    removed = await api.http.put("/v1/queues/default/limit", json={})
    assert removed.json()["max_running"] is None


async def test_a_key_limit_has_its_own_name(api: Harness) -> None:
    response = await api.http.put("/v1/keys/cust-1/limit", json={"max_running": 1})
    assert response.status_code == 200, response.text
    assert response.json()["name"] == "key:cust-1"
    assert [e.key for e in api.log.events(KeyLimitSet)][:1] == ["cust-1"]
    assert (await api.http.get("/v1/keys/cust-1/limit")).json()["max_running"] == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_running": 0}, "max_running"),
        ({"rate_starts": 5}, "rate_starts"),
        ({"max_running": "2"}, "max_running"),
        ({"rate_starts": 1, "rate_per_ms": 0}, "rate_per_ms"),
    ],
)
async def test_a_bad_limit_is_a_4xx_naming_the_field(
    api: Harness, body: dict[str, object], field: str
) -> None:
    response = await api.http.put("/v1/queues/default/limit", json=body)
    assert 400 <= response.status_code < 500
    assert field in response.text
