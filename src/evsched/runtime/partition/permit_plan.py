"""A partition owner's part in global limits (core.permits): which due jobs may be leased, the
permit requests of those that lack one, and the grants of the limits the partition is home to."""

from __future__ import annotations

from evsched.core import permits, planner
from evsched.core.events import PermitRequested, QueuePermit
from evsched.core.state import JobState, Status
from evsched.runtime.partition.pending import Pending
from evsched.runtime.projection.projector import Folded, Projector

# A permit proposal and the entity its pending entry holds back.
Proposal = tuple[str, PermitRequested | QueuePermit]


class PermitPlanner:
    """Plans permit steps from the projector's limits; ``OwnedPartition`` sends them."""

    def __init__(self, projector: Projector, pending: Pending, source: str) -> None:
        self.projector = projector
        self.pending = pending
        self.source = source
        self._asks: list[PermitRequested] = []

    def active(self, folded: Folded | None = None) -> bool:
        """Whether this partition folded any limit (else nothing here costs anything)."""
        return bool(self.projector.limits_as(folded))

    def permitted(self, candidates: list[JobState], now: int, folded: Folded) -> list[JobState]:
        """The candidates that may be leased; due jobs under a limit without a permit ask for
        one (``take`` hands the requests out with this step's other proposals).

        Limits are read through ``folded`` (not committed yet): planning follows its records.
        """
        limits = self.projector.limits_as(folded)
        ok = [s for s in candidates if permits.may_lease(limits, s)]
        if len(ok) < len(candidates):
            asking = [s for s in candidates if s.status is Status.SCHEDULED]
            self._asks += permits.plan_requests(
                asking, limits, now=now, source=self.source, order=planner.due_order
            )
        return ok

    def asked(self) -> int:
        """How many requests planning made so far this step (``retract`` takes back later ones)."""
        return len(self._asks)

    def retract(self, asked: int) -> None:
        del self._asks[asked:]

    def take(self, now: int, folded: Folded) -> list[Proposal]:
        """The requests made while planning leases, then the grants of this partition's homes."""
        asks: list[Proposal] = [(ask.job_id, ask) for ask in self._asks]
        self._asks = []
        return asks + self._grants(now, folded)

    def _grants(self, now: int, folded: Folded) -> list[Proposal]:
        out: list[Proposal] = []
        for state in list(self.projector.limits_as(folded).values()):
            if not state.waiting:
                continue
            name = state.name

            def pending(job_id: str, name: str = name) -> bool:
                return grant_entity(name, job_id) in self.pending.entities

            grants = permits.plan_grants(state, pending=pending, now=now, source=self.source)
            out += [(grant_entity(name, g.job_id), g) for g in grants]
        return out

    def waits(self, state: JobState, folded: Folded) -> bool:
        """Whether the due job waits for a grant (it must not fill a scan's window)."""
        return permits.waiting_for_grant(self.projector.limits_as(folded), state)

    def wakes(self, now: int) -> list[int | None]:
        """When rate-limited homes with waiting requests next have room."""
        return [permits.next_grant_at(s, now) for s in self.projector.limits.values()]


def grant_entity(name: str, job_id: str) -> str:
    """What a pending grant of a home holds back: the job's grant, not the job itself."""
    return f"permit-grant:{name}:{job_id}"
