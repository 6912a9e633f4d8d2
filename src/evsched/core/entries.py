"""The timeline entry of one folded event: where it was read, what it was, and the verdict."""

from __future__ import annotations

from evsched.core.events import Event, Position
from evsched.core.slots import entry_of
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
    return entry_of(
        position.partition,
        position.offset,
        position.log_at,
        type(event).__name__,
        event.event_id,
        event.source,
        verdict,
        reason,
        token,
        status_after,
    )
