"""Cron timing with time zones (croniter + zoneinfo); all instants are epoch milliseconds."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter


class InvalidSchedule(ValueError):
    """A cron expression or time zone that cannot be used."""


def _zone(timezone: str) -> ZoneInfo:
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSchedule(f"unknown time zone {timezone!r}") from exc


def validate(cron: str, timezone: str) -> None:
    """Raise InvalidSchedule naming what is wrong with ``cron`` or ``timezone``."""
    _zone(timezone)
    if not croniter.is_valid(cron):
        raise InvalidSchedule(f"invalid cron expression {cron!r}")


def next_fire_at(cron: str, timezone: str, after: int) -> int:
    """The first slot strictly after ``after`` (epoch ms), in ``timezone``'s wall clock."""
    validate(cron, timezone)
    start = datetime.fromtimestamp(after / 1000, tz=_zone(timezone))
    nxt = croniter(cron, start).get_next(datetime)
    return int(nxt.timestamp() * 1000)


def latest_due_slot(cron: str, timezone: str, next_fire: int, now: int) -> int | None:
    """The newest slot in ``[next_fire, now]``, or None if ``next_fire`` is still ahead.

    Missed slots coalesce into one fire (the newest): a scheduler that was down for a day runs a
    nightly job once, not once per missed night.
    """
    if now < next_fire:
        return None
    validate(cron, timezone)
    start = datetime.fromtimestamp((now + 1) / 1000, tz=_zone(timezone))
    prev = int(croniter(cron, start).get_prev(datetime).timestamp() * 1000)
    return max(prev, next_fire)
