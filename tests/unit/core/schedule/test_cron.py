"""Cron timing: time zones, both DST transitions, missed-slot coalescing, invalid input."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from evsched.core.schedule import cron

PARIS = ZoneInfo("Europe/Paris")
UTC = ZoneInfo("UTC")


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def paris(*args: int, fold: int = 0) -> int:
    return ms(datetime(*args, tzinfo=PARIS, fold=fold))  # type: ignore[misc]


def slots(expr: str, zone: str, after: int, n: int) -> list[str]:
    out: list[str] = []
    for _ in range(n):
        nxt = cron.next_fire_at(expr, zone, after)
        assert nxt is not None
        out.append(datetime.fromtimestamp(nxt / 1000, tz=ZoneInfo(zone)).isoformat())
        after = nxt
    return out


def test_next_fire_is_strictly_after() -> None:
    slot = ms(datetime(2025, 1, 1, 0, 5, tzinfo=UTC))
    assert cron.next_fire_at("*/5 * * * *", "UTC", slot - 1) == slot
    assert cron.next_fire_at("*/5 * * * *", "UTC", slot) == slot + 300_000
    assert cron.next_fire_at("*/5 * * * *", "UTC", slot - 299_999) == slot


def test_wall_clock_of_the_schedule_zone_is_used() -> None:
    winter = ms(datetime(2025, 1, 10, tzinfo=UTC))
    summer = ms(datetime(2025, 7, 10, tzinfo=UTC))
    assert cron.next_fire_at("0 9 * * *", "America/New_York", winter) == ms(
        datetime(2025, 1, 10, 14, tzinfo=UTC)
    )
    assert cron.next_fire_at("0 9 * * *", "America/New_York", summer) == ms(
        datetime(2025, 7, 10, 13, tzinfo=UTC)
    )


def test_spring_forward_slot_that_does_not_exist_fires_right_after_the_gap() -> None:
    # 2025-03-30 in Paris: 02:00 jumps to 03:00, so 02:30 never happens that night.
    assert slots("30 2 * * *", "Europe/Paris", paris(2025, 3, 29, 12), 3) == [
        "2025-03-30T03:00:00+02:00",
        "2025-03-31T02:30:00+02:00",
        "2025-04-01T02:30:00+02:00",
    ]


def test_fall_back_slot_at_a_fixed_hour_fires_once() -> None:
    # 2025-10-26 in Paris: 03:00 falls back to 02:00, so 02:30 happens twice; the job runs once.
    assert slots("30 2 * * *", "Europe/Paris", paris(2025, 10, 25, 12), 3) == [
        "2025-10-26T02:30:00+02:00",
        "2025-10-27T02:30:00+01:00",
        "2025-10-28T02:30:00+01:00",
    ]
    assert slots("*/30 2 * * *", "Europe/Paris", paris(2025, 10, 26, 1), 3) == [
        "2025-10-26T02:00:00+02:00",
        "2025-10-26T02:30:00+02:00",
        "2025-10-27T02:00:00+01:00",
    ]


def test_fall_back_keeps_real_time_cadence_when_the_hour_field_is_a_wildcard() -> None:
    assert slots("*/30 * * * *", "Europe/Paris", paris(2025, 10, 26, 1, 45), 5) == [
        "2025-10-26T02:00:00+02:00",
        "2025-10-26T02:30:00+02:00",
        "2025-10-26T02:00:00+01:00",
        "2025-10-26T02:30:00+01:00",
        "2025-10-26T03:00:00+01:00",
    ]


def test_latest_due_slot_is_none_while_the_next_slot_is_ahead() -> None:
    nxt = paris(2025, 3, 31, 2, 30)
    assert cron.latest_due_slot("30 2 * * *", "Europe/Paris", nxt, nxt - 1) is None


def test_latest_due_slot_coalesces_missed_slots_into_the_newest() -> None:
    missed_since = paris(2025, 3, 27, 2, 30)
    now = paris(2025, 3, 31, 9, 0)
    assert cron.latest_due_slot("30 2 * * *", "Europe/Paris", missed_since, now) == paris(
        2025, 3, 31, 2, 30
    )
    exactly = paris(2025, 3, 31, 2, 30)
    assert cron.latest_due_slot("30 2 * * *", "Europe/Paris", missed_since, exactly) == exactly
    assert cron.latest_due_slot("30 2 * * *", "Europe/Paris", exactly, exactly) == exactly


def test_latest_due_slot_skips_the_repeated_pass_of_a_fall_back() -> None:
    first = paris(2025, 10, 26, 2, 30)
    during_repeat = paris(2025, 10, 26, 2, 45, fold=1)
    missed_since = paris(2025, 10, 24, 2, 30)
    assert cron.latest_due_slot("30 2 * * *", "Europe/Paris", missed_since, during_repeat) == first


def test_latest_due_slot_never_goes_below_next_fire() -> None:
    # A next_fire that is not a slot (callers always pass one) still bounds the answer.
    odd = ms(datetime(2025, 1, 1, 0, 7, tzinfo=UTC))
    assert cron.latest_due_slot("*/5 * * * *", "UTC", odd, odd + 60_000) == odd


@pytest.mark.parametrize("expr", ["0 0 31 2 *", "0 0 30 2 *", "0 0 1 1 * 0 2020"])
def test_expression_without_slots_left_has_no_next_fire(expr: str) -> None:
    assert cron.next_fire_at(expr, "UTC", ms(datetime(2025, 1, 1, tzinfo=UTC))) is None


def test_latest_due_slot_of_an_expression_that_never_fires_is_none() -> None:
    assert (
        cron.latest_due_slot("0 0 31 2 *", "UTC", 0, ms(datetime(2025, 1, 1, tzinfo=UTC))) is None
    )


def test_latest_due_slot_of_a_finished_year_is_its_last_slot() -> None:
    now = ms(datetime(2025, 1, 1, tzinfo=UTC))
    last = ms(datetime(2020, 1, 1, tzinfo=UTC))
    assert cron.latest_due_slot("0 0 1 1 * 0 2020", "UTC", 0, now) == last


def test_is_slot() -> None:
    slot = ms(datetime(2025, 1, 1, 0, 5, tzinfo=UTC))
    assert cron.is_slot("*/5 * * * *", "UTC", slot)
    assert not cron.is_slot("*/5 * * * *", "UTC", slot + 1)
    assert not cron.is_slot("*/5 * * * *", "UTC", slot - 60_000)
    assert not cron.is_slot("30 2 * * *", "Europe/Paris", paris(2025, 10, 26, 2, 30, fold=1))


@pytest.mark.parametrize("expr", ["", "* * *", "61 * * * *", "*/0 * * * *", "@reboot", "\x00"])
def test_invalid_expression_is_refused(expr: str) -> None:
    with pytest.raises(cron.InvalidSchedule, match="invalid cron expression"):
        cron.validate(expr, "UTC")
    with pytest.raises(cron.InvalidSchedule):
        cron.next_fire_at(expr, "UTC", 0)


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "/abs", "UTC+2"])
def test_unknown_time_zone_is_refused(zone: str) -> None:
    with pytest.raises(cron.InvalidSchedule, match="unknown time zone"):
        cron.validate("* * * * *", zone)
    with pytest.raises(cron.InvalidSchedule):
        cron.latest_due_slot("* * * * *", zone, 0, 1)
