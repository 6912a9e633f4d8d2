"""Operations on a whole workflow: which jobs a cancel or a requeue touches, and the fold's
requeue of a child to wait again on its parents (``JobRequeued.rewait``, fold version 5).

A child cancelled because a parent failed (or cancelled while it waited) is requeued with
``rewait``: it drops the failed parents' resolutions, keeps the others, and waits again, so the
re-run parent's next accepted end resolves it once more, exactly once (I8 counts a re-armed wait
as a new run of the child). A job its parents had released and that then failed on its own is
requeued as any job is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from evsched.core.events import JobRequeued, Position
from evsched.core.state import TERMINAL_STATUSES, JobState, Resolution, Status, Verdict
from evsched.core.workflow import waits as workflows
from evsched.core.workflow.graph import GraphNode, WorkflowGraph

Step = tuple[JobState | None, Verdict, str]
Applier = Callable[..., JobState]

# Resolutions a rewait drops: their parents are re-run (or were cancelled) and end again.
FAILED_OUTCOMES = frozenset({Status.DEAD.value, Status.CANCELLED.value})
FAILED = frozenset({Status.DEAD, Status.CANCELLED})
REQUEUE, REWAIT = "requeue", "rewait"


def rewait_refusal(
    rule: str, after: tuple[str, ...], resolutions: tuple[Resolution, ...]
) -> tuple[str, str] | None:
    """Why a child cannot wait again on its parents, as (how to requeue it instead, reason):
    ``requeue`` when its parents had released it (its own run failed), ``""`` when it cannot be
    requeued to wait at all; None when it can."""
    if not after:
        return REQUEUE, "it waits on no parent"
    if workflows.rule_outcome(rule, after, resolutions) == "release":
        return REQUEUE, f"its parents released it (rule {rule} met)"
    kept = _kept(resolutions)
    if workflows.rule_outcome(rule, after, kept) != "wait":
        gone = ", ".join(f"{r.parent_id} {r.outcome}" for r in kept if r.outcome != "succeeded")
        return "", f"rule {rule} can no longer be met ({gone})"
    return None


def _kept(resolutions: tuple[Resolution, ...]) -> tuple[Resolution, ...]:
    return tuple(r for r in resolutions if r.outcome not in FAILED_OUTCOMES)


def rewaited(state: JobState, event: JobRequeued, pos: Position, apply: Applier) -> Step:
    """A dead or cancelled child waits again on the parents whose resolution was a failure."""
    if state.status not in FAILED:
        return state, Verdict.REJECTED, f"cannot requeue to wait: job is {state.status}"
    refusal = rewait_refusal(state.after_rule, state.after, state.resolutions)
    if refusal is not None:
        return state, Verdict.REJECTED, f"cannot requeue to wait: {refusal[1]}"
    kept = _kept(state.resolutions)
    new = apply(
        state,
        event,
        pos,
        status=Status.WAITING,
        resolutions=kept,
        attempt=0,
        run_at=pos.log_at if event.run_at is None else event.run_at,
        lease_until=None,
        worker_id=None,
        snoozes=0,
    )
    left = len(state.after) - len(kept)
    why = f"requeued by {event.source} to wait again on {left} of its {len(state.after)} parents"
    return new, Verdict.APPLIED, why


# --- plans over a workflow's graph --------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelPlan:
    """Jobs to cancel (children before parents) and jobs already finished or missing."""

    cancel: tuple[str, ...]
    finished: tuple[str, ...]
    missing: tuple[str, ...]


def cancel_plan(graph: WorkflowGraph) -> CancelPlan:
    """Every job of the workflow that has not ended, children first: written together, each
    child's cancel precedes any resolution its parent's cancel sends it."""
    found = [n for n in graph.nodes if n.found]
    return CancelPlan(
        cancel=tuple(n.id for n in reversed(found) if not _ended(n)),
        finished=tuple(n.id for n in found if _ended(n)),
        missing=tuple(n.id for n in graph.nodes if not n.found),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RequeuePlan:
    """How each dead or cancelled job of the workflow goes back (``requeue`` or ``rewait``),
    those that cannot (with why), and ends not yet delivered to children (nothing may be written
    until they are: a late resolution would undo a rewait)."""

    steps: tuple[tuple[str, str], ...]
    skipped: tuple[tuple[str, str], ...]
    settling: tuple[str, ...]

    @property
    def rewaits(self) -> int:
        return sum(how == REWAIT for _, how in self.steps)


def requeue_plan(graph: WorkflowGraph) -> RequeuePlan:
    """The dead and cancelled jobs of the workflow (its failed branches), parents first."""
    nodes = {n.id: n for n in graph.nodes if n.found}
    steps: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for node in nodes.values():
        if _status(node) in FAILED:
            refusal = rewait_refusal(node.rule or "", _after(node), _resolutions(node))
            if refusal is None:
                steps[node.id] = REWAIT
            elif refusal[0] == REQUEUE:
                steps[node.id] = REQUEUE
            else:
                skipped[node.id] = refusal[1]
    _drop_orphans(nodes, steps, skipped)
    return RequeuePlan(
        steps=tuple(steps.items()),
        skipped=tuple(skipped.items()),
        settling=tuple(_settling(nodes)),
    )


def _drop_orphans(
    nodes: dict[str, GraphNode], steps: dict[str, str], skipped: dict[str, str]
) -> None:
    """Skip each rewait with a failed parent that will not end again (until none is left)."""
    changed = True
    while changed:
        changed = False
        for job_id, how in list(steps.items()):
            why = None if how == REQUEUE else _orphaned(nodes[job_id], nodes, steps)
            if why is not None:
                del steps[job_id]
                skipped[job_id] = why
                changed = True


def _orphaned(node: GraphNode, nodes: dict[str, GraphNode], steps: dict[str, str]) -> str | None:
    for link in node.parents:
        if link.outcome not in FAILED_OUTCOMES or link.id in steps:
            continue
        parent = nodes.get(link.id)
        if parent is None:
            return f"parent {link.id} is not in the index"
        if _ended(parent):
            return f"parent {link.id} is {parent.status} and will not end again"
    return None


def _settling(nodes: dict[str, GraphNode]) -> Iterable[str]:
    for node in nodes.values():
        for link in node.parents:
            parent = nodes.get(link.id)
            if link.outcome is None and parent is not None and _ended(parent):
                yield f"{node.id} has not yet recorded the end of its parent {link.id}"


def _status(node: GraphNode) -> Status:
    return Status(str(node.status))


def _ended(node: GraphNode) -> bool:
    return _status(node) in TERMINAL_STATUSES


def _after(node: GraphNode) -> tuple[str, ...]:
    return tuple(link.id for link in node.parents)


def _resolutions(node: GraphNode) -> tuple[Resolution, ...]:
    return tuple(
        Resolution(
            parent_id=link.id,
            outcome=link.outcome,
            partition=link.partition or 0,
            offset=link.offset or 0,
        )
        for link in node.parents
        if link.outcome is not None
    )
