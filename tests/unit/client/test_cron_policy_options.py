"""Cron policy options at the edges: the client's and API's schedule options, and the
``schedules backfill`` command's events and bounds."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import typer

from evsched.commands import build_schedule
from evsched.core import ids
from evsched.core.events import JobTemplate, Position
from evsched.core.schedule import policy as cron_policy
from evsched.core.schedule.fold import fold_schedule
from evsched.errors import InvalidEnqueue
from evsched.operator.commands.schedule_backfill import backfill_fires
from tests.unit.api.test_api import error_of
from tests.unit.api.test_api_twin import Harness

MINUTE = 60_000
TEMPLATE = JobTemplate(task="t", queue="default", args=b"[]")


def test_a_schedule_takes_its_policies_in_seconds_or_timedeltas() -> None:
    event = build_schedule(
        "s", "* * * * *", "UTC", TEMPLATE, now_ms=0, event_id="e",
        catchup_window=timedelta(hours=1), max_jitter=2.5,
    )  # fmt: skip
    assert (event.catchup_window_ms, event.max_jitter_ms) == (3_600_000, 2_500)
    plain = build_schedule("s", "* * * * *", "UTC", TEMPLATE, now_ms=0, event_id="e")
    assert (plain.catchup_window_ms, plain.max_jitter_ms) == (None, None)
    with pytest.raises(InvalidEnqueue) as caught:
        build_schedule("s", "* * * * *", "UTC", TEMPLATE, now_ms=0, event_id="e", max_jitter=-1)
    assert caught.value.field == "max_jitter"


async def test_the_api_sets_and_shows_a_schedule_s_policies(tmp_path: Path) -> None:
    async with Harness(tmp_path) as api:
        body = {"cron": "* * * * *", "task": "t.tick", "catchup_window_s": 600.0}
        created = await api.http.put("/v1/schedules/tick", json=body | {"max_jitter_s": 5.0})
        assert created.status_code == 201, created.text
        assert (created.json()["catchup_window_s"], created.json()["max_jitter_s"]) == (600, 5)
        bad = await api.http.put("/v1/schedules/tick", json=body | {"max_jitter_s": -1.0})
        assert bad.status_code == 422
        assert "max_jitter_s" in str(error_of(bad).get("field"))


def test_a_backfill_writes_each_slot_s_fire_and_job_with_the_node_s_ids() -> None:
    upserted = build_schedule("s", "*/10 * * * *", "UTC", TEMPLATE, now_ms=0, event_id="e")
    schedule, _ = fold_schedule(None, upserted, Position(partition=0, offset=0, log_at=0))
    assert schedule is not None
    start = 1_767_225_600_000  # 2026-01-01T00:00Z, a slot

    pairs = backfill_fires(schedule, start, start + 30 * MINUTE, now=start + 99 * MINUTE)

    fires = [fire for fire, _ in pairs]
    jobs = [job for _, job in pairs]
    slots = [start + n * 10 * MINUTE for n in range(4)]
    assert [f.fire_at for f in fires] == [j.fire_at for j in jobs] == slots
    assert {f.decision for f in fires} == {cron_policy.BACKFILLED}
    assert [j.job_id for j in jobs] == [ids.job_id_for_fire("s", slot) for slot in slots]
    assert [f.job_id for f in fires] == [j.job_id for j in jobs]


def test_a_backfill_of_an_empty_or_too_long_range_is_a_usage_error() -> None:
    upserted = build_schedule("s", "0 0 1 1 *", "UTC", TEMPLATE, now_ms=0, event_id="e")
    yearly, _ = fold_schedule(None, upserted, Position(partition=0, offset=0, log_at=0))
    assert yearly is not None
    with pytest.raises(typer.BadParameter, match="no slot of"):
        backfill_fires(yearly, 1_000, 2_000, now=3_000)
    every, _ = fold_schedule(
        None,
        build_schedule("m", "* * * * *", "UTC", TEMPLATE, now_ms=0, event_id="e"),
        Position(partition=0, offset=0, log_at=0),
    )
    assert every is not None
    with pytest.raises(typer.BadParameter, match="more than 1000 slots"):
        backfill_fires(every, 0, 2_000 * MINUTE, now=3_000 * MINUTE)
