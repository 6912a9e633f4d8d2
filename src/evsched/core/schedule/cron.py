"""Cron timing with time zones (croniter + zoneinfo); all instants are epoch milliseconds."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from evsched.core import bounds


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
    # Checked before croniter sees it: croniter would draw R fields from `random`.
    random_field = bounds.random_cron_refusal(cron)
    if random_field is not None:
        raise InvalidSchedule(random_field)
    if not croniter.is_valid(cron):
        raise InvalidSchedule(f"invalid cron expression {cron!r}")


def _slots(cron: str, timezone: str, at: int) -> croniter:
    validate(cron, timezone)
    return croniter(cron, datetime.fromtimestamp(at / 1000, tz=_zone(timezone)))


def _repeat(slots: croniter, slot: datetime) -> bool:
    """Whether ``slot`` is the second pass through a wall-clock time a DST fall-back repeats.

    Like Vixie cron, a job at fixed hours runs once on that night ("30 2 * * *" fires at the first
    02:30 only); an expression whose hour field is ``*`` keeps its cadence in real time.
    """
    if slots.expanded[1] == ["*"]:
        return False
    return slot.fold == 1 and slot.replace(fold=0).utcoffset() != slot.utcoffset()


def next_fire_at(cron: str, timezone: str, after: int) -> int | None:
    """The first slot strictly after ``after`` (epoch ms) in ``timezone``'s wall clock.

    None when the expression has no slot left (e.g. "0 0 31 2 *", or a year field in the past).
    """
    slots = _slots(cron, timezone, after)
    try:
        slot = slots.get_next(datetime)
        while _repeat(slots, slot):
            slot = slots.get_next(datetime)
    except CroniterError:
        return None
    return int(slot.timestamp() * 1000)


def is_slot(cron: str, timezone: str, at: int) -> bool:
    """Whether ``at`` is one of the expression's slots (as ``next_fire_at`` yields them)."""
    return next_fire_at(cron, timezone, at - 1) == at


def latest_due_slot(cron: str, timezone: str, next_fire: int, now: int) -> int | None:
    """The newest slot in ``[next_fire, now]``, or None if ``next_fire`` is still ahead (or never).

    Missed slots coalesce into one fire (the newest): a scheduler that was down for a day runs a
    nightly job once, not once per missed night.
    """
    if now < next_fire:
        return None
    slots = _slots(cron, timezone, now + 1)
    try:
        slot = slots.get_prev(datetime)
        while _repeat(slots, slot):
            slot = slots.get_prev(datetime)
    except CroniterError:
        return None
    return max(int(slot.timestamp() * 1000), next_fire)
