"""Decisions a partition sent but has not folded back yet, so it does not propose them again."""

from __future__ import annotations

from dataclasses import dataclass, field

from evsched.ports import Clock


@dataclass(slots=True)
class Pending:
    """Decisions sent but not yet folded back, so the next step doesn't propose them again.

    Deadlines are in ``clock``'s monotonic seconds.
    """

    clock: Clock
    by_event: dict[str, tuple[str, float]] = field(default_factory=dict)
    entities: dict[str, int] = field(default_factory=dict)
    leases_by_queue: dict[str, int] = field(default_factory=dict)
    queue_of: dict[str, str] = field(default_factory=dict)

    def add(self, event_id: str, entity: str, queue: str | None, deadline: float) -> None:
        self.by_event[event_id] = (entity, deadline)
        self.entities[entity] = self.entities.get(entity, 0) + 1
        if queue is not None:
            self.queue_of[event_id] = queue
            self.leases_by_queue[queue] = self.leases_by_queue.get(queue, 0) + 1

    def first_deadline_ms(self, now: int) -> int | None:
        """The earliest pending deadline as an epoch-ms time (deadlines are monotonic seconds)."""
        if not self.by_event:
            return None
        soonest = min(deadline for _, deadline in self.by_event.values())
        return now + max(0, int((soonest - self.clock.monotonic_s()) * 1000))

    def settle(self, event_ids: set[str], monotonic_now: float) -> None:
        done = [e for e, (_, dl) in self.by_event.items() if e in event_ids or dl <= monotonic_now]
        for event_id in done:
            entity, _ = self.by_event.pop(event_id)
            self.entities[entity] -= 1
            if not self.entities[entity]:
                del self.entities[entity]
            queue = self.queue_of.pop(event_id, None)
            if queue is not None:
                self.leases_by_queue[queue] -= 1

    def forget(self, entity: str) -> None:
        """Drop the pending decisions about ``entity`` (they were not sent)."""
        self.settle({e for e, (ent, _) in self.by_event.items() if ent == entity}, float("-inf"))
