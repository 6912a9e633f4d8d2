"""Issue 9 A.1-A.3 and B.5 at the edge: what the fold would refuse, the client and the API refuse
first (InvalidEnqueue / 422 naming the field), so an accepted write is never refused later."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from evsched.commands import (
    build_schedule,
    check_id,
    check_labels,
    job_template,
    task_spec,
)
from evsched.core.events import RetryPolicy
from evsched.errors import InvalidEnqueue, InvalidTask
from tests.unit.api.test_api import error_of
from tests.unit.api.test_api_twin import Harness


def spec(**over: object) -> object:
    options: dict[str, object] = {
        "queue": "q",
        "max_attempts": 3,
        "retry": RetryPolicy(),
        "timeout_s": 1.0,
        "priority": 0,
        "retry_on": (Exception,),
        "permanent_on": (),
    } | over
    return task_spec("t", **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"max_attempts": 2**31}, "max_attempts"),
        ({"timeout_s": 1e12}, "timeout_s"),
        ({"retry": RetryPolicy(max_backoff_ms=2**62)}, "retry"),
        ({"retry": RetryPolicy(multiplier=1e6)}, "retry"),
        ({"queue": "q" * 201}, "queue"),
    ],
)
def test_task_options_beyond_the_fold_limits_are_refused(
    over: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidTask) as raised:
        spec(**over)
    assert raised.value.field == field


def test_ids_and_labels_are_checked_in_utf8_bytes() -> None:
    assert check_id("schedule_id", "é" * 512) == "é" * 512
    with pytest.raises(InvalidEnqueue, match="1024"):
        check_id("schedule_id", "😀" * 300)  # 300 characters, 1,200 bytes
    with pytest.raises(InvalidEnqueue, match="65 entries"):
        check_labels({str(i): "" for i in range(65)})


@pytest.mark.parametrize("expression", ["R * * * *", "0 R * * *", "H/5 * * * *"])
def test_a_random_cron_field_is_refused_on_the_cron_field(expression: str) -> None:
    template = job_template(spec(), [], {})  # type: ignore[arg-type]
    with pytest.raises(InvalidEnqueue) as raised:
        build_schedule("s", expression, "UTC", template, now_ms=0, event_id="e")
    assert raised.value.field == "cron"
    assert "random or hashed" in str(raised.value)


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


async def test_the_api_answers_422_for_a_random_cron(api: Harness) -> None:
    response = await api.http.put("/v1/schedules/r", json={"cron": "R * * * *", "task": "t"})
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == "cron"


async def test_the_api_answers_422_for_labels_beyond_the_limit(api: Harness) -> None:
    labels = {f"k{i}": "v" for i in range(65)}
    response = await api.http.post("/v1/jobs", json={"task": "t", "labels": labels})
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == "labels"
