"""A node's partition lifecycle: the phases an assigned partition goes through, and the legal moves.

::

    ASSIGNED -> OPENING -> CATCHING_UP -> RUNNING -> CLOSING -> CLOSED
                   |  ^         |            |
                   v  |         +------------+--> FAILED -> OPENING (retried later)
               RESTORING                     +--> FENCED (until the next assignment)

A partition is OPENING while its index opens and its producer starts; RESTORING while its index
is rebuilt from the log (another fold version built it); CATCHING_UP until it has folded the log
as it stood when it opened (it decides nothing before); RUNNING after. FAILED partitions are
reopened after a wait; FENCED ones wait for the group's next assignment. Any phase that is not
open ends in CLOSED when the partition is revoked. A move not in the table is a bug: it raises.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from evsched.errors import EvschedError


class Phase(enum.StrEnum):
    ASSIGNED = "assigned"
    OPENING = "opening"
    RESTORING = "restoring"
    CATCHING_UP = "catching_up"
    RUNNING = "running"
    CLOSING = "closing"
    CLOSED = "closed"
    FAILED = "failed"
    FENCED = "fenced"


TRANSITIONS: Mapping[Phase, frozenset[Phase]] = {
    Phase.ASSIGNED: frozenset({Phase.OPENING, Phase.CLOSED}),
    Phase.OPENING: frozenset({Phase.RESTORING, Phase.CATCHING_UP, Phase.FAILED, Phase.CLOSED}),
    Phase.RESTORING: frozenset({Phase.OPENING, Phase.FAILED, Phase.CLOSED}),
    Phase.CATCHING_UP: frozenset({Phase.RUNNING, Phase.CLOSING, Phase.FAILED, Phase.FENCED}),
    Phase.RUNNING: frozenset({Phase.CLOSING, Phase.FAILED, Phase.FENCED}),
    Phase.CLOSING: frozenset({Phase.CLOSED}),
    Phase.FAILED: frozenset({Phase.OPENING, Phase.CLOSED}),
    Phase.FENCED: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset({Phase.ASSIGNED}),
}

# Phases in which the partition has a runner (an open index and producer) to close.
OPEN = frozenset({Phase.CATCHING_UP, Phase.RUNNING})


class InvalidTransition(EvschedError):
    """A partition moved between two phases the lifecycle does not connect: a bug in the node."""

    def __init__(self, partition: int, old: Phase | None, new: Phase) -> None:
        was = "unknown" if old is None else old.value
        super().__init__(f"partition {partition}: no transition from {was} to {new.value}")
        self.partition = partition
        self.old = old
        self.new = new


def check(partition: int, old: Phase | None, new: Phase) -> None:
    """Raise InvalidTransition unless ``old -> new`` is in the table (None: not yet assigned)."""
    allowed = frozenset({Phase.ASSIGNED}) if old is None else TRANSITIONS[old]
    if new not in allowed:
        raise InvalidTransition(partition, old, new)
