"""The ``unique`` option at every edge: task definitions, per-call options, the HTTP API (verdict
header, field errors) and the operator CLI's ``--unique``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import typer

from evsched.client import App
from evsched.commands import EnqueueOptions, TaskSpec, Unique, build_enqueue
from evsched.core import ids
from evsched.errors import InvalidEnqueue, InvalidTask
from evsched.operator.writes import unique_option
from tests.unit.api.test_api import error_of
from tests.unit.api.test_api_twin import SETTINGS, Harness

SPEC = TaskSpec(name="t")
NEW_IDS = iter(f"id-{n}" for n in range(1_000))


def scoped(options: EnqueueOptions, spec: TaskSpec = SPEC) -> tuple[str, Any, Any]:
    event = build_enqueue(spec, b"[1]", options, now_ms=1_000, new_id=lambda: next(NEW_IDS))
    return event.job_id, event.unique, event.unique_period_ms


@pytest.mark.parametrize(
    ("value", "scope", "period"),
    [
        ("queued", "queued", None),
        ("active", "active", None),
        (timedelta(minutes=1), "period", 60_000),
        (1.5, "period", 1_500),
    ],
)
def test_a_call_s_scope_travels_on_the_event_and_its_id_derives_from_the_body(
    value: Unique, scope: str, period: int | None
) -> None:
    job_id, got_scope, got_period = scoped(EnqueueOptions(unique=value))

    expected_id = ids.job_id_for_unique("default", "t", b"[1]")
    assert (job_id, got_scope, got_period) == (expected_id, scope, period)


def test_without_a_scope_the_id_is_new_and_with_a_key_it_is_the_key_s() -> None:
    assert scoped(EnqueueOptions())[1:] == (None, None)
    assert scoped(EnqueueOptions())[0].startswith("id-")
    keyed = scoped(EnqueueOptions(unique="active", idempotency_key="k"))
    assert keyed == (ids.job_id_for_key("default", "k"), "active", None)
    from_task = scoped(EnqueueOptions(), TaskSpec(name="t", unique="queued"))
    assert from_task[1] == "queued"


@pytest.mark.parametrize("value", ["always", "period", 0, -1.0, float("nan"), True])
def test_a_bad_scope_is_refused_naming_the_option(value: Any) -> None:
    with pytest.raises(InvalidEnqueue) as caught:
        scoped(EnqueueOptions(unique=value))
    assert caught.value.field == "unique"


def test_a_task_defines_its_scope_and_a_bad_one_is_refused() -> None:
    app = App(SETTINGS)

    @app.task(name="sync", unique=timedelta(seconds=30))
    def sync(customer: int) -> None:
        return None

    assert (sync.spec.unique, sync.spec.unique_period_ms) == ("period", 30_000)
    with pytest.raises(InvalidTask, match="unique"):
        app.task(name="bad", unique="sometimes")(lambda: None)


async def test_the_api_answers_a_duplicate_with_200_and_its_verdict(tmp_path: Path) -> None:
    async with Harness(tmp_path) as api:
        body = {"task": "t.run", "args": [1], "unique": "active"}
        first = await api.http.post("/v1/jobs", json=body)
        again = await api.http.post("/v1/jobs", json=body)
        other = await api.http.post("/v1/jobs", json={**body, "args": [2]})

        assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
        assert first.headers["evsched-verdict"] == "applied"
        assert again.headers["evsched-verdict"] == "duplicate"
        assert first.json()["id"] == again.json()["id"] != other.json()["id"]
        timeline = (await api.http.get(f"/v1/jobs/{first.json()['id']}/timeline")).json()
        duplicate = timeline["events"][-1]
        assert (duplicate["verdict"], duplicate["reason"]) == (
            "duplicate",
            "unique while queued or running: run 0 is scheduled",
        )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"unique": "period"}, "unique_period_s"),
        ({"unique": "queued", "unique_period_s": 5.0}, "unique_period_s"),
        ({"unique_period_s": 5.0}, "unique_period_s"),
        ({"unique": "sometimes"}, "unique"),
    ],
)
async def test_the_api_refuses_a_bad_scope_naming_the_field(
    tmp_path: Path, body: dict[str, Any], field: str
) -> None:
    async with Harness(tmp_path) as api:
        response = await api.http.post("/v1/jobs", json={"task": "t.run", **body})

        assert response.status_code == 422
        assert field in str(error_of(response).get("field"))


async def test_the_api_takes_a_period_and_a_defined_task_s_scope(tmp_path: Path) -> None:
    harness = Harness(tmp_path)
    app = App(SETTINGS, log_factory=lambda: harness.log)

    @app.task(name="sync", unique="queued")
    async def sync(customer: int) -> None:
        return None

    harness.client_app = app
    async with harness as api:
        period = {"task": "t.run", "unique": "period", "unique_period_s": 60.0}
        assert (await api.http.post("/v1/jobs", json=period)).status_code == 201
        assert (await api.http.post("/v1/jobs", json=period)).status_code == 200
        defined = {"task": "sync", "args": [7]}
        assert (await api.http.post("/v1/jobs", json=defined)).status_code == 201
        assert (await api.http.post("/v1/jobs", json=defined)).status_code == 200


def test_the_cli_takes_a_scope_or_seconds() -> None:
    assert unique_option(None) is None
    assert unique_option("queued") == "queued"
    assert unique_option("90") == 90.0
    with pytest.raises(typer.BadParameter, match="must be queued, active or seconds"):
        unique_option("sometimes")
