"""The schedule fold: upserts, deletes and fires, with their verdicts."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime

from evsched.core import ids
from evsched.core.events import (
    JobTemplate,
    Position,
    ScheduleDeleted,
    ScheduleEvent,
    ScheduleFired,
    ScheduleUpserted,
)
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import ScheduleState, Status, TimelineEntry, Verdict

MINUTE = 60_000
T0 = int(datetime(2025, 1, 1, tzinfo=UTC).timestamp() * 1000)  # a slot of every schedule here
TEMPLATE = JobTemplate(task="report", queue="cron", args=b"{}")
_seq = itertools.count()


def upsert(expr: str = "*/5 * * * *", zone: str = "UTC") -> ScheduleUpserted:
    return ScheduleUpserted(
        event_id=f"e{next(_seq)}",
        schedule_id="s",
        emitted_at=0,
        source="api",
        cron=expr,
        timezone=zone,
        template=TEMPLATE,
    )


def delete() -> ScheduleDeleted:
    return ScheduleDeleted(event_id=f"e{next(_seq)}", schedule_id="s", emitted_at=0, source="api")


def fire(fire_at: int) -> ScheduleFired:
    return ScheduleFired(
        event_id=f"e{next(_seq)}",
        schedule_id="s",
        emitted_at=0,
        source="node-1",
        fire_at=fire_at,
        job_id=ids.job_id_for_fire("s", fire_at),
    )


@dataclass
class Schedule:
    state: ScheduleState | None = None
    offset: int = 0

    def apply(self, event: ScheduleEvent, at: int) -> TimelineEntry:
        before = self.state
        self.state, entry = fold_schedule(
            before, event, Position(partition=1, offset=self.offset, log_at=at)
        )
        self.offset += 1
        if entry.verdict is not Verdict.APPLIED:
            assert self.state is before
        return entry

    @property
    def current(self) -> ScheduleState:
        assert self.state is not None
        return self.state


def test_upsert_creates_a_schedule_due_at_its_next_slot() -> None:
    s = Schedule()
    entry = s.apply(upsert(), T0 + 1)
    assert (entry.verdict, entry.reason) == (Verdict.APPLIED, "schedule created: */5 * * * * (UTC)")
    assert entry.status_after is Status.SCHEDULED
    state = s.current
    assert (state.next_fire_at, state.created_at, state.updated_at) == (
        T0 + 5 * MINUTE,
        T0 + 1,
        T0 + 1,
    )
    assert state.recent_event_ids == (entry.event_id,)


def test_invalid_expression_or_zone_is_rejected_and_changes_nothing() -> None:
    s = Schedule()
    entry = s.apply(upsert("not cron"), T0)
    assert (entry.verdict, entry.status_after, s.state) == (Verdict.REJECTED, None, None)
    assert s.apply(upsert(zone="Nowhere/Land"), T0).verdict is Verdict.REJECTED
    s.apply(upsert(), T0)
    kept = s.current
    assert s.apply(upsert("61 * * * *"), T0 + 1).verdict is Verdict.REJECTED
    assert s.current is kept


def test_expression_that_never_fires_is_rejected() -> None:
    entry = Schedule().apply(upsert("0 0 31 2 *"), T0)
    assert (entry.verdict, entry.reason) == (
        Verdict.REJECTED,
        "cron expression '0 0 31 2 *' never fires again",
    )


def test_fire_applies_and_advances_to_the_next_slot() -> None:
    s = Schedule()
    s.apply(upsert(), T0 - 1)
    entry = s.apply(fire(T0), T0 + 250)
    assert entry.verdict is Verdict.APPLIED
    state = s.current
    assert (state.last_fire_at, state.next_fire_at) == (T0, T0 + 5 * MINUTE)
    assert state.last_job_id == ids.job_id_for_fire("s", T0)


def test_fire_duplicate_early_and_before_next_are_refused() -> None:
    s = Schedule()
    s.apply(upsert(), T0 - 1)
    s.apply(fire(T0), T0)
    dup = s.apply(fire(T0), T0 + 1)  # a second node firing the same slot
    assert (dup.verdict, dup.reason) == (Verdict.DUPLICATE, f"slot {T0} already fired")
    early = s.apply(fire(T0 + 5 * MINUTE), T0 + 5 * MINUTE - 1)
    assert (early.verdict, early.reason) == (
        Verdict.REJECTED,
        f"slot {T0 + 5 * MINUTE} fired before it was due",
    )
    before_next = s.apply(fire(T0 - 5 * MINUTE), T0 + 6 * MINUTE)
    assert before_next.verdict is Verdict.REJECTED
    assert "before the next due slot" in before_next.reason


def test_fire_of_a_time_that_is_not_a_slot_is_rejected() -> None:
    s = Schedule()
    s.apply(upsert("*/5 * * * *"), T0 - 1)
    s.apply(upsert("*/7 * * * *"), T0 - 1)  # a zombie node still fires the old expression
    entry = s.apply(fire(T0 + 5 * MINUTE), T0 + 6 * MINUTE)
    assert (entry.verdict, entry.reason) == (
        Verdict.REJECTED,
        f"{T0 + 5 * MINUTE} is not a slot of '*/7 * * * *'",
    )
    assert s.apply(fire(T0 + 7 * MINUTE), T0 + 7 * MINUTE).verdict is Verdict.APPLIED


def test_coalesced_fire_of_the_newest_missed_slot_is_accepted() -> None:
    s = Schedule()
    s.apply(upsert(), T0 - 1)
    assert s.apply(fire(T0 + 60 * MINUTE), T0 + 62 * MINUTE).verdict is Verdict.APPLIED
    assert s.current.next_fire_at == T0 + 65 * MINUTE


def test_replacing_the_expression_never_fires_an_already_fired_slot_again() -> None:
    s = Schedule()
    s.apply(upsert("0 * * * *"), T0 - 1)
    s.apply(fire(T0 + 60 * MINUTE), T0 + 60 * MINUTE)
    entry = s.apply(upsert("*/30 * * * *"), T0 + 10 * MINUTE)  # log time behind the last fire
    assert entry.reason == "schedule replaced: */30 * * * * (UTC)"
    state = s.current
    assert (state.next_fire_at, state.last_fire_at, state.created_at) == (
        T0 + 90 * MINUTE,
        T0 + 60 * MINUTE,
        T0 - 1,
    )


def test_delete_then_fire_rejected_then_recreate() -> None:
    s = Schedule()
    s.apply(upsert(), T0 - 1)
    deleted = s.apply(delete(), T0)
    assert (deleted.verdict, deleted.status_after) == (Verdict.APPLIED, None)
    assert (s.current.deleted, s.current.next_fire_at) == (True, None)
    assert s.apply(fire(T0), T0).verdict is Verdict.REJECTED
    assert s.apply(delete(), T0).verdict is Verdict.REJECTED
    again = s.apply(upsert(), T0 + 1)
    assert again.reason == "schedule created: */5 * * * * (UTC)"
    assert not s.current.deleted


def test_unknown_schedule_refuses_delete_and_fire() -> None:
    assert Schedule().apply(delete(), T0).verdict is Verdict.REJECTED
    assert Schedule().apply(fire(T0), T0).verdict is Verdict.REJECTED


def test_schedule_with_a_year_field_is_exhausted_after_its_last_slot() -> None:
    s = Schedule()
    s.apply(upsert("0 0 1 1 * 0 2026"), T0)
    last = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    assert s.current.next_fire_at == last
    assert s.apply(fire(last), last).verdict is Verdict.APPLIED
    assert s.current.next_fire_at is None
    assert s.apply(fire(last), last + 1).verdict is Verdict.DUPLICATE
    later = s.apply(fire(last + 1), last + 2)
    assert (later.verdict, later.reason) == (
        Verdict.REJECTED,
        "schedule exhausted: its expression has no slot left",
    )


def test_replayed_event_id_is_a_duplicate() -> None:
    s = Schedule()
    first = upsert()
    s.apply(first, T0)
    assert s.apply(first, T0 + 1).verdict is Verdict.DUPLICATE
