"""The event router: every kind declares one family and one timeline, and each family reaches its
fold, in the core's replay and in the projector alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_args

import pytest

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex, control_key, limit_key
from evsched.core import events as ev
from evsched.core.controls import QUEUE, fold_control
from evsched.core.events import EventFamily, EventTimeline, entity_id
from evsched.core.fold import fold
from evsched.core.invariants import Replay
from evsched.core.permits import fold_limit, fold_permit
from evsched.core.routing import EVENT_TYPE_OF_KIND, event_types, kinds, timeline_of_kind
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import Verdict
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector

UNIONS: dict[EventFamily, Any] = {
    EventFamily.JOB: ev.JobEvent,
    EventFamily.SCHEDULE: ev.ScheduleEvent,
    EventFamily.CONTROL: ev.ControlEvent,
    EventFamily.LIMIT: ev.LimitEvent,
    EventFamily.PERMIT: ev.PermitEvent,
}
TABLES: dict[EventFamily, tuple[type[ev.Event], ...]] = {
    EventFamily.JOB: ev.JOB_EVENT_TYPES,
    EventFamily.SCHEDULE: ev.SCHEDULE_EVENT_TYPES,
    EventFamily.CONTROL: ev.CONTROL_EVENT_TYPES,
    EventFamily.LIMIT: ev.LIMIT_EVENT_TYPES,
    EventFamily.PERMIT: ev.PERMIT_EVENT_TYPES,
}
# The entity whose timeline keeps each kind that is not kept on its job's: written out, since a
# wrong timeline keys an entry under another entity's first byte in the index.
TIMELINES: dict[type[ev.Event], EventTimeline] = {
    **dict.fromkeys(ev.SCHEDULE_EVENT_TYPES, EventTimeline.SCHEDULE),
    ev.SchedulePaused: EventTimeline.SCHEDULE,
    ev.ScheduleResumed: EventTimeline.SCHEDULE,
    ev.QueuePaused: EventTimeline.QUEUE,
    ev.QueueResumed: EventTimeline.QUEUE,
    ev.QueueLimitSet: EventTimeline.QUEUE,
    ev.KeyLimitSet: EventTimeline.QUEUE,
    ev.QueuePermit: EventTimeline.PERMIT,
}
T0 = 1_767_225_600_000
META: dict[str, Any] = {"emitted_at": T0, "source": "test"}
# One event of each family, in an order whose every event is applied.
SAMPLES: dict[EventFamily, ev.Event] = {
    EventFamily.JOB: ev.JobEnqueued(
        event_id="e1", job_id="j1", task="t", queue="q", args=b"", **META
    ),
    EventFamily.SCHEDULE: ev.ScheduleUpserted(
        event_id="e2",
        schedule_id="s1",
        cron="*/5 * * * *",
        timezone="UTC",
        template=ev.JobTemplate(task="t", queue="q", args=b""),
        **META,
    ),
    EventFamily.CONTROL: ev.SchedulePaused(event_id="e3", schedule_id="s1", **META),
    EventFamily.LIMIT: ev.QueueLimitSet(event_id="e4", queue="q", max_running=1, **META),
    EventFamily.PERMIT: ev.PermitRequested(event_id="e5", job_id="j1", queue="q", **META),
}


def _at(offset: int) -> ev.Position:
    return ev.Position(partition=0, offset=offset, log_at=T0 + offset)


def test_every_kind_declares_the_family_of_the_union_it_is_in() -> None:
    assert set(UNIONS) == set(EventFamily) == set(TABLES)
    for family, union in UNIONS.items():
        declared = [cls for cls in ev.EVENT_TYPES if cls.family is family]
        assert declared == list(get_args(union)) == list(TABLES[family]), family
        assert event_types(family) == TABLES[family]
    assert len(set(ev.EVENT_TYPES)) == len(ev.EVENT_TYPES) == len(EVENT_TYPE_OF_KIND)


def test_every_event_class_of_core_events_is_routed_by_class_variables() -> None:
    """An event class missing from the unions would reach no fold: none is."""
    classes = {
        cls
        for cls in vars(ev).values()
        if isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and "event_id" in {f.name for f in dataclasses.fields(cls)}
    }
    assert classes == set(ev.EVENT_TYPES)
    for cls in classes:
        names = {f.name for f in dataclasses.fields(cls)}
        assert "family" not in names and "timeline" not in names, cls  # not on the wire
        assert isinstance(cls.family, EventFamily) and isinstance(cls.timeline, EventTimeline)


def test_each_kind_is_kept_on_the_timeline_of_the_entity_it_is_keyed_by() -> None:
    for cls in ev.EVENT_TYPES:
        assert cls.timeline is TIMELINES.get(cls, EventTimeline.JOB), cls
        assert timeline_of_kind(cls.__name__) is cls.timeline
    assert timeline_of_kind("undecodable") is EventTimeline.JOB


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (SAMPLES[EventFamily.JOB], "j1"),
        (SAMPLES[EventFamily.PERMIT], "j1"),
        (SAMPLES[EventFamily.SCHEDULE], "s1"),
        (SAMPLES[EventFamily.CONTROL], "s1"),
        (ev.QueuePaused(event_id="e", queue="q", **META), "q"),
        (SAMPLES[EventFamily.LIMIT], "q"),
        (ev.KeyLimitSet(event_id="e", key="k", **META), "key:k"),
        (ev.QueuePermit(event_id="e", queue="q", job_id="j", action="grant", **META), "q"),
        (
            ev.QueuePermit(event_id="e", queue="q", key="k", job_id="j", action="grant", **META),
            "key:k",
        ),
    ],
)
def test_an_event_is_keyed_by_the_id_of_its_timeline(event: ev.Event, expected: str) -> None:
    assert entity_id(event) == expected


def test_kinds_name_the_events_of_the_families_asked_for() -> None:
    assert kinds() == frozenset()
    assert kinds(EventFamily.CONTROL) == {
        "QueuePaused",
        "QueueResumed",
        "SchedulePaused",
        "ScheduleResumed",
    }
    assert kinds(EventFamily.LIMIT, EventFamily.PERMIT) == {
        "QueueLimitSet",
        "KeyLimitSet",
        "QueuePermit",
        "PermitRequested",
        "PermitGranted",
    }
    assert kinds(*EventFamily) == set(EVENT_TYPE_OF_KIND)


def test_each_family_reaches_its_own_fold_in_the_replay() -> None:
    """On an empty history, the replay's entry is the one the family's fold gives."""
    at = _at(0)
    folds = {
        EventFamily.JOB: lambda e: fold(None, e, at)[1],
        EventFamily.SCHEDULE: lambda e: fold_schedule(None, e, at)[1],
        EventFamily.CONTROL: lambda e: fold_control(None, e, at, exists=False)[1],
        EventFamily.LIMIT: lambda e: fold_limit(None, e, at)[1],
        EventFamily.PERMIT: lambda e: fold_permit(None, None, e, at)[1],
    }
    assert set(folds) == set(EventFamily)
    for family, event in SAMPLES.items():
        assert Replay().feed(event, at) == folds[family](event), family


def test_the_projector_routes_every_family_as_the_replay_does(tmp_path: Path) -> None:
    history = [(event, _at(offset)) for offset, event in enumerate(SAMPLES.values())]
    replay = Replay()
    entries = [replay.feed(event, at) for event, at in history]
    assert all(entry.verdict is Verdict.APPLIED for entry in entries)
    index = PartitionIndex(tmp_path / "index", 0)
    try:
        records = [
            Record("events", 0, at.offset, at.log_at, entity_id(e).encode(), avro.encode_event(e))
            for e, at in history
        ]
        folded = Projector(index).fold(records)
    finally:
        index.close()
    assert folded.verdicts == [(entry.kind, entry.verdict) for entry in entries]
    batch = folded.batch
    assert [(entity, entry) for entity, entry, _ in batch.timeline] == [
        (entity_id(e), entry) for (e, _), entry in zip(history, entries, strict=True)
    ]
    assert batch.jobs["j1"] == replay.jobs["j1"]
    assert batch.schedules["s1"] == replay.schedules["s1"]
    assert batch.controls[control_key("schedule", "s1")] == replay.controls[0, "schedule", "s1"]
    assert batch.limits[limit_key("q")] == replay.limits[0, "q"]
    assert QUEUE not in {state.target for state in batch.controls.values()}
