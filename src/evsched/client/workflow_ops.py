"""Cancel or requeue a whole workflow: the events of a plan (``core.workflow.ops``), written in one
Kafka transaction, and the tally of the verdicts the fold gave them.

The HTTP API and ``evsched workflow`` both read the graph from their replica, plan with the core,
build the events here and write them with ``client.workflows.write_atomically``; each then
reads the verdicts back its own way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evsched.core.events import JobCancelled, JobRequeued
from evsched.core.state import Verdict
from evsched.core.workflow.ops import REWAIT, CancelPlan, RequeuePlan


def cancel_events(
    plan: CancelPlan,
    *,
    root: str,
    reason: str,
    now_ms: int,
    source: str,
    new_id: Callable[[], str],
) -> list[JobCancelled]:
    """A JobCancelled per job of the plan, children first, each naming the workflow's job."""
    why = f"workflow cancel (of {root})" + (f": {reason}" if reason else "")
    return [
        JobCancelled(event_id=new_id(), job_id=job_id, emitted_at=now_ms, source=source, reason=why)
        for job_id in plan.cancel
    ]


def requeue_events(
    plan: RequeuePlan,
    *,
    root: str,
    reason: str,
    now_ms: int,
    source: str,
    new_id: Callable[[], str],
) -> list[JobRequeued]:
    """A JobRequeued per job of the plan; a child whose parents failed waits again (rewait)."""
    why = f"workflow requeue (of {root})" + (f": {reason}" if reason else "")
    return [
        JobRequeued(
            event_id=new_id(),
            job_id=job_id,
            emitted_at=now_ms,
            source=source,
            reason=why,
            rewait=how == REWAIT,
        )
        for job_id, how in plan.steps
    ]


@dataclass(slots=True)
class Tally:
    """What became of a workflow operation's writes: applied, refused (with why), not yet known."""

    applied: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def tally(judged: Sequence[tuple[str, Verdict | None, str]]) -> Tally:
    """(job id, verdict or None when not read back, reason) of each write, counted."""
    found = Tally()
    for job_id, verdict, reason in judged:
        if verdict is None:
            found.unknown.append(job_id)
        elif verdict in (Verdict.APPLIED, Verdict.DUPLICATE):
            found.applied.append(job_id)
        else:
            found.refused.append((job_id, reason))
    return found
