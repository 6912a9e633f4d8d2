"""The timeline entry of one folded event: where it was read, what it was, and the verdict."""

from __future__ import annotations

from evsched.core.events import Event, Position
from evsched.core.slots import new_entry
from evsched.core.state import Status, TimelineEntry, Verdict


def judged(
    event: Event,
    position: Position,
    verdict: Verdict,
    reason: str,
    *,
    token: int | None = None,
    status_after: Status | None = None,
) -> TimelineEntry:
    """The entry of ``event``, read at ``position``, as the fold judged it."""
    return new_entry(
        partition=position.partition,
        offset=position.offset,
        log_at=position.log_at,
        kind=type(event).__name__,
        event_id=event.event_id,
        source=event.source,
        verdict=verdict,
        reason=reason,
        token=token,
        status_after=status_after,
    )
