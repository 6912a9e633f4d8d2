"""Decisions held back because their records cannot go now, until a time on the partition's clock.

A decision (a lease with its dispatch record, an expiry, a cron fire) that cannot be encoded or
sent is one job's problem, never the partition's: it is quarantined with a logged reason and a
metric, the step goes out without it, and it is planned again after ``QUARANTINE_S``. Effects are
never held back: a step whose effects cannot be sent fails and is retried whole. Decisions the fold
refused, or would refuse, are held here too, for a back-off of their own
(``runtime.partition.refusals``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from evsched.ports import Clock, Outgoing

if TYPE_CHECKING:
    from evsched.metrics import PartitionInstruments

log = structlog.get_logger("evsched.node")

# How long a decision that could not be encoded or sent is held back before it is planned again
# (one on an undeclared queue: as long as QueueTopics waits to look again):
# the cause may be gone by then (a topic repaired), and each failure costs one log line.
QUARANTINE_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Unusable:
    """Why a queue's dispatch topic can't be sent to now: its decisions are held back."""

    stage: str  # undeclared (no topic: an operator declares the queue) or topic (misconfigured)
    reason: str
    hold_s: float | None = None  # how long its decisions are held; None: QUARANTINE_S


# Checks the dispatch topics of ``queues``; returns those that can't be used now, and why.
EnsureQueues = Callable[[set[str]], Awaitable[Mapping[str, Unusable]]]


class Quarantine:
    """Decisions held back, by entity id, until a monotonic time of ``clock``."""

    def __init__(
        self,
        partition: int,
        clock: Clock,
        instruments: PartitionInstruments | None = None,
        hold_s: float = QUARANTINE_S,
    ) -> None:
        self.partition = partition
        self.clock = clock
        self.instruments = instruments
        self.hold_s = hold_s
        self._until: dict[str, float] = {}
        self.fresh: set[str] = set()  # added since the caller last took them

    def holds(self, entity: str) -> bool:
        until = self._until.get(entity)
        if until is None:
            return False
        if until > self.clock.monotonic_s():
            return True
        del self._until[entity]
        return False

    def add(
        self,
        entity: str,
        stage: str,
        reason: str,
        *,
        hold_s: float | None = None,
        quiet: bool = False,
    ) -> None:
        """Hold ``entity``'s decisions back; ``stage`` is encode, topic, undeclared or send.

        ``quiet``: the cause is logged elsewhere, once for many decisions (an undeclared queue).
        """
        hold_s = self.hold_s if hold_s is None else hold_s
        self._until[entity] = self.clock.monotonic_s() + hold_s
        self.fresh.add(entity)
        if not quiet:
            log.warning(
                "decision_quarantined",
                partition=self.partition,
                entity=entity,
                stage=stage,
                reason=reason,
                retry_in_s=hold_s,
            )
        if self.instruments is not None:
            self.instruments.quarantined(stage).inc()

    def release(self, entity: str) -> None:
        """Plan ``entity``'s decisions again from now on (what held it back is gone)."""
        self._until.pop(entity, None)

    def first_release_ms(self, now: int) -> int | None:
        """When the first held decision may be planned again, as an epoch-ms time."""
        clock = self.clock.monotonic_s()
        released = [e for e, until in self._until.items() if until <= clock]
        for entity in released:
            del self._until[entity]  # released: planned again like any job
        if released:
            # Released since the step's plan skipped them: plan again now, or nothing would
            # (no record may come to wake the partition).
            return now
        if not self._until:
            return None
        return now + max(0, int((min(self._until.values()) - clock) * 1000))

    def take_fresh(self) -> set[str]:
        fresh, self.fresh = self.fresh, set()
        return fresh

    def __len__(self) -> int:
        return len(self._until)


async def hold_unusable(
    outgoing: Sequence[Outgoing], quarantine: Quarantine, ensure_queues: EnsureQueues
) -> list[Outgoing]:
    """``outgoing`` without the decisions held back, after holding those on unusable queues."""
    queues = {o.queue for o in outgoing if o.queue is not None}
    refused = await ensure_queues(queues) if queues else {}
    for o in outgoing:
        if o.queue is None or o.queue not in refused or o.decision is None:
            continue
        if not quarantine.holds(o.decision):
            why = refused[o.queue]
            quiet = why.stage == "undeclared"  # QueueTopics logs queue_undeclared instead
            quarantine.add(o.decision, why.stage, why.reason, hold_s=why.hold_s, quiet=quiet)
    return [o for o in outgoing if o.decision is None or not quarantine.holds(o.decision)]
