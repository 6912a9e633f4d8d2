"""The fold's generated constructors and copies make exactly what the dataclasses would."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evsched.core.events import LeaseRenewed, Position
from evsched.core.fold import RECENT_EVENT_IDS, _applied
from evsched.core.slots import entry_of, new_state, slot_filler
from evsched.core.state import JobState, TimelineEntry
from tests.strategies import job_states, records, timeline_entries

JOB_FIELDS = [f.name for f in fields(JobState)]


def _as_kwargs(value: Any) -> dict[str, Any]:
    return {f.name: getattr(value, f.name) for f in fields(value)}


@given(state=job_states())
def test_new_state_equals_the_constructor(state: JobState) -> None:
    made = new_state(**_as_kwargs(state))

    assert made == state
    assert type(made) is JobState


@given(entry=timeline_entries())
def test_entry_of_equals_the_constructor(entry: TimelineEntry) -> None:
    made = entry_of(*_as_kwargs(entry).values())

    assert made == entry
    assert type(made) is TimelineEntry


@settings(max_examples=200, deadline=None)
@given(state=job_states(), other=job_states(), data=st.data())
def test_applied_equals_replace_for_any_set_of_changed_fields(
    state: JobState, other: JobState, data: st.DataObject
) -> None:
    names = data.draw(st.lists(st.sampled_from(JOB_FIELDS), unique=True), label="changed")
    changes = {name: getattr(other, name) for name in names}
    event = data.draw(records(LeaseRenewed))
    position = data.draw(records(Position))

    new = _applied(state, event, position, **changes)

    recent = (*state.recent_event_ids, event.event_id)[-RECENT_EVENT_IDS:]
    marks = {"recent_event_ids": recent, "updated_at": position.log_at}  # they win, as before
    assert new == replace(state, **{**changes, **marks})
    assert new is not state


def test_applied_refuses_a_field_jobstate_does_not_have() -> None:
    state = JobState(**{f.name: None for f in fields(JobState)})
    event = LeaseRenewed(event_id="e", job_id="j", emitted_at=0, source="s", token=1, lease_ms=1)

    with pytest.raises(AttributeError, match="lease_untill"):
        _applied(state, event, Position(partition=0, offset=0, log_at=0), lease_untill=5)


def test_slot_filling_refuses_classes_whose_init_does_more() -> None:
    @dataclass(frozen=True, slots=True)
    class Checked:
        x: int

        def __post_init__(self) -> None:
            raise AssertionError

    @dataclass(frozen=True, slots=True)
    class Derived:
        x: int
        y: int = field(init=False, default=0)

    for cls in (Checked, Derived):
        with pytest.raises(TypeError, match="plain dataclass"):
            slot_filler(cls, "x", str)
    assert dataclasses.is_dataclass(Checked)
