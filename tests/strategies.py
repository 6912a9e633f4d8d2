"""Hypothesis strategies for the core's events and states, derived from their type hints.

``records(cls, field=strategy, ...)`` fills every field, defaulted ones included, so a field added
to a core dataclass is generated without touching this file; pass a field to narrow it (e.g. a few
job ids, to make collisions likely in fold tests).
"""

from __future__ import annotations

import dataclasses
import enum
import types
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from hypothesis import strategies as st

from evsched.core.events import EVENT_TYPES, Event
from evsched.core.state import JobState, ScheduleState, TimelineEntry

T = TypeVar("T")

# Every integer of the wire contract is an Avro long.
longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
texts = st.text(max_size=12)
blobs = st.binary(max_size=24)
# NaN is excluded because NaN != NaN would defeat equality checks, not because it can't encode.
doubles = st.floats(allow_nan=False)


def _for_hint(hint: Any) -> st.SearchStrategy[Any]:
    origin = get_origin(hint)
    if origin is types.UnionType:
        present = [arg for arg in get_args(hint) if arg is not types.NoneType]
        return st.none() | st.one_of(*(_for_hint(arg) for arg in present))
    if origin is dict:
        key, value = get_args(hint)
        return st.dictionaries(_for_hint(key), _for_hint(value), max_size=3)
    if origin is tuple:
        return st.lists(_for_hint(get_args(hint)[0]), max_size=3).map(tuple)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(hint)
    if dataclasses.is_dataclass(hint):
        return records(hint)  # type: ignore[arg-type]
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: texts,
        bytes: blobs,
        bool: st.booleans(),
        int: longs,
        float: doubles,
    }
    return simple[hint]


def records(cls: type[T], **overrides: st.SearchStrategy[Any]) -> st.SearchStrategy[T]:
    """Instances of the dataclass ``cls``, every field drawn; ``overrides`` take precedence."""
    hints = get_type_hints(cls)
    unknown = overrides.keys() - hints.keys()
    if unknown:
        raise TypeError(f"{cls.__name__} has no fields {sorted(unknown)}")
    drawn = {
        f.name: overrides[f.name] if f.name in overrides else _for_hint(hints[f.name])
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
    }
    return st.builds(cls, **drawn)


EVENT_STRATEGIES: dict[type[Any], st.SearchStrategy[Any]] = {
    cls: records(cls) for cls in EVENT_TYPES
}


def events() -> st.SearchStrategy[Event]:
    """Any event of any kind."""
    return st.one_of(*EVENT_STRATEGIES.values())


def job_states() -> st.SearchStrategy[JobState]:
    return records(JobState)


def schedule_states() -> st.SearchStrategy[ScheduleState]:
    return records(ScheduleState)


def timeline_entries() -> st.SearchStrategy[TimelineEntry]:
    return records(TimelineEntry)
