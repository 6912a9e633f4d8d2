"""The event router: which fold and which timeline each kind of event goes to, from one declaration.

Each event class in core.events declares its ``family`` (the fold that judges it) and its
``timeline`` (whose timeline keeps it) as class variables, and is a member of its family's union.
Code holding an event routes it with ``match event.family:`` over every ``EventFamily``, ending in
``assert_never``: mypy narrows the event to that family's union in each case and proves every
family handled, and at run time it is one class-attribute read, not a chain of ``isinstance``.
Code holding only a stored entry's ``kind`` (the index's keys, audits, archives skipping records
undecoded) asks this module, which reads the same declarations. So a new kind of an existing
family is added to the schema, core.events, its fold and the tests, and to no router.
"""

from __future__ import annotations

from collections.abc import Mapping

from evsched.core.events import EVENT_TYPES, Event, EventFamily, EventTimeline

# Entries name their event by its class: ``TimelineEntry.kind`` is ``type(event).__name__``.
EVENT_TYPE_OF_KIND: Mapping[str, type[Event]] = {cls.__name__: cls for cls in EVENT_TYPES}


def event_types(family: EventFamily) -> tuple[type[Event], ...]:
    """The kinds of event of ``family``, in the order of core.events.EVENT_TYPES."""
    return tuple(cls for cls in EVENT_TYPES if cls.family is family)


def kinds(*families: EventFamily) -> frozenset[str]:
    """The kind names of the events of ``families``, to pick stored entries without decoding."""
    return frozenset(cls.__name__ for family in families for cls in event_types(family))


def timeline_of_kind(kind: str) -> EventTimeline:
    """The timeline of a stored entry of ``kind``: a job's for a record that is no event (one
    that did not decode, ``undecodable``)."""
    cls = EVENT_TYPE_OF_KIND.get(kind)
    return EventTimeline.JOB if cls is None else cls.timeline
