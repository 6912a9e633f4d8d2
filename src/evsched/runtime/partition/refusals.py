"""Decisions the fold refused or would refuse: held back per entity with a doubling back-off.

A node's decision is a proposal, judged by the fold. It can be refused two ways: the node's dry
run (``core.proposals``) says the fold would not apply it, so it is never sent; or it went out
and came back refused (a node clock ahead of the log's makes a lease early, a state moved in
between; a ``duplicate`` is no refusal: the decision took effect before). Planned again from the
same state, it would be refused again, and each round is a record in the log, the index and the
changelog. So the entity (a job, or a schedule for a fire)
is held back in the partition's ``Quarantine`` (skipped by the scans, woken when the hold ends)
for a back-off that doubles with each refusal of the same state: REFUSAL_BACKOFF_S, twice that,
and so on up to REFUSAL_BACKOFF_MAX_S. Any applied event of the entity means its state changed:
its refusals are forgotten and the hold ends, so the next decision is planned from the new state
at once.

The back-off runs on the partition's clock, like the quarantine's, not on log time: a quiet
partition's log time does not move, and a held decision must come back by itself (the early
lease of a clock ahead of the broker's goes through once the log's time has caught up).
Memory is bounded and deterministic: the counts of the REFUSALS_KEPT entities refused most
recently; one forgotten past the bound starts again at the first back-off.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping

import structlog

from evsched.core.state import TimelineEntry, Verdict
from evsched.runtime.partition.quarantine import Quarantine

log = structlog.get_logger("evsched.node")

REFUSAL_BACKOFF_S = 1.0
# At most a minute: a decision rejected while the node's clock ran ahead goes out at most a
# minute after the log's time caught up, at the cost of one refused record a minute meanwhile.
REFUSAL_BACKOFF_MAX_S = 60.0
REFUSALS_KEPT = 10_000
# The doubling stops here (2**6 s is past the cap already): no float overflow however many.
_MAX_DOUBLINGS = 16

# Quarantine stages (the ``stage`` label of evsched_node_decisions_quarantined_total).
DRY_RUN = "fold"  # the dry run refused it: never sent
REJECTED = "rejected"  # sent, and the fold did not apply it


class Refusals:
    """One partition's refused decisions: how often each entity's state was refused in a row."""

    def __init__(
        self, partition: int, quarantine: Quarantine, *, kept: int = REFUSALS_KEPT
    ) -> None:
        self.partition = partition
        self.quarantine = quarantine
        self.kept = kept
        self._counts: OrderedDict[str, int] = OrderedDict()

    def vet(self, entity: str, kind: str, refusal: str | None) -> bool:
        """Whether a planned decision may go: ``refusal`` is its dry run's (None: applied)."""
        if refusal is None:
            return True
        hold_s = self._hold(entity, DRY_RUN, refusal)
        log.warning(
            "decision_refused",
            partition=self.partition,
            **_named(kind, entity),
            kind=kind,
            reason=refusal,
            retry_in_s=hold_s,
        )
        return False

    def observe(
        self,
        timeline: Iterable[tuple[str, TimelineEntry, bytes]],
        ours: Mapping[str, tuple[str, float]],
    ) -> None:
        """Read a folded batch's verdicts in log order: an applied event forgets its entity's
        refusals; a decision of ours (pending, by event id) that came back refused (any verdict
        but applied or duplicate) holds back the entity it was pending for."""
        if not ours and not self._counts:
            return  # nothing of ours to judge, nothing to forget: the usual idle step
        for entity, entry, _ in timeline:
            if entry.verdict is Verdict.APPLIED:
                self.forget(entity)
            elif entry.verdict is not Verdict.DUPLICATE and entry.event_id in ours:
                held = ours[entry.event_id][0]
                hold_s = self._hold(held, REJECTED, entry.reason)
                log.warning(
                    "decision_rejected",
                    partition=self.partition,
                    **_named(entry.kind, held),
                    kind=entry.kind,
                    offset=entry.offset,
                    verdict=entry.verdict.value,
                    reason=entry.reason,
                    retry_in_s=hold_s,
                )

    def forget(self, entity: str) -> None:
        """``entity``'s state changed: plan its decisions from it at once."""
        if self._counts.pop(entity, None) is not None:
            self.quarantine.release(entity)

    def refused(self, entity: str) -> int:
        """How often ``entity``'s current state was refused in a row (0: never, or forgotten)."""
        return self._counts.get(entity, 0)

    def _hold(self, entity: str, stage: str, reason: str) -> float:
        count = self._counts.pop(entity, 0) + 1
        self._counts[entity] = count
        if len(self._counts) > self.kept:
            self._counts.popitem(last=False)  # the least recently refused
        hold_s = min(
            REFUSAL_BACKOFF_S * 2.0 ** min(count - 1, _MAX_DOUBLINGS), REFUSAL_BACKOFF_MAX_S
        )
        self.quarantine.add(entity, stage, reason, hold_s=hold_s, quiet=True)
        return hold_s

    def __len__(self) -> int:
        return len(self._counts)


def _named(kind: str, entity: str) -> dict[str, str]:
    """The log line's id field: a fire's schedule, else the job the decision is about."""
    return {"schedule_id" if kind == "ScheduleFired" else "job_id": entity}
