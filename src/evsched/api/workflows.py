"""``/v1/jobs/{id}/workflow``: a workflow's graph from this API's replica, and the cancel and the
requeue of the whole workflow (its failed branches), through the cancel and requeue paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Query

from evsched.adapters.ids import new_id
from evsched.api import reader
from evsched.api.context import Ctx, Writes
from evsched.api.errors import ApiError
from evsched.api.id_fields import JobId
from evsched.api.jobs import FOUND
from evsched.api.responses import READ, WRITE, error
from evsched.api.workflow_models import (
    WorkflowCancel,
    WorkflowCancelled,
    WorkflowRequeue,
    WorkflowRequeued,
    WorkflowView,
    WriteOutcome,
)
from evsched.api.writes import SOURCE
from evsched.client.workflow_ops import cancel_events, requeue_events, tally
from evsched.client.workflows import write_atomically
from evsched.core.events import JobCancelled, JobRequeued
from evsched.core.state import Verdict
from evsched.core.workflow.graph import (
    DEFAULT_NODE_LIMIT,
    MAX_NODE_LIMIT,
    WorkflowGraph,
    as_json,
    read_graph,
)
from evsched.core.workflow.ops import cancel_plan, requeue_plan

router = APIRouter(prefix="/v1/jobs", tags=["workflows"])

Limit = Annotated[
    int,
    Query(
        ge=1,
        le=MAX_NODE_LIMIT,
        description="At most this many jobs; past it the answer says truncated.",
    ),
]
# Cancel and requeue read the whole workflow: they refuse one past this many jobs.
OPERATION_LIMIT = MAX_NODE_LIMIT
TOO_BIG = error(f"The workflow has more than {OPERATION_LIMIT} jobs.")


@router.get("/{job_id}/workflow", response_model=WorkflowView, responses={**READ, **FOUND})
async def workflow(ctx: Ctx, job_id: JobId, limit: Limit = DEFAULT_NODE_LIMIT) -> WorkflowView:
    """Every job reachable from this one through parents and children, parents first: each with
    its status, rule, and each parent's resolution (outcome and the record of the parent's end,
    partition@offset) — read from this API's replica."""
    return WorkflowView.model_validate(as_json(_graph(ctx, job_id, limit)))


@router.post(
    "/{job_id}/workflow/cancel",
    response_model=WorkflowCancelled,
    dependencies=[Writes],
    responses={**WRITE, **FOUND, 409: TOO_BIG},
)
async def cancel_workflow(
    ctx: Ctx, job_id: JobId, body: WorkflowCancel | None = None
) -> WorkflowCancelled:
    """Cancel every job of the workflow that has not ended, in one transaction (children first);
    children waiting on a cancelled parent then follow their rule. Repeating it cancels nothing."""
    graph = _whole(ctx, job_id)
    plan = cancel_plan(graph)
    events = cancel_events(
        plan,
        root=job_id,
        reason=(body or WorkflowCancel()).reason,
        now_ms=ctx.writer.now_ms(),
        source=SOURCE,
        new_id=new_id,
    )
    outcomes = await _write(ctx, events)
    counted = tally([(o.id, o.verdict, o.reason) for o in outcomes])
    return WorkflowCancelled(
        root=job_id,
        cancelled=len(counted.applied),
        already_finished=len(plan.finished) + len(counted.refused),
        not_confirmed=len(counted.unknown),
        missing=list(plan.missing),
        jobs=outcomes,
    )


@router.post(
    "/{job_id}/workflow/requeue",
    response_model=WorkflowRequeued,
    dependencies=[Writes],
    responses={**WRITE, **FOUND, 409: error("Too big, or its ends have not all reached children.")},
)
async def requeue_workflow(
    ctx: Ctx, job_id: JobId, body: WorkflowRequeue | None = None
) -> WorkflowRequeued:
    """Requeue the dead and cancelled jobs of the workflow; children cancelled because a parent
    failed wait again for it (``rewait``), so its next success releases them once and the rest
    of the workflow continues. ``dry_run`` only says what would go."""
    body = body or WorkflowRequeue()
    plan = requeue_plan(_whole(ctx, job_id))
    if plan.settling:
        raise ApiError(
            409,
            "workflow_settling",
            f"the workflow is settling: {plan.settling[0]}; try again in a moment",
        )
    skipped = [WriteOutcome(id=i, how=None, verdict=None, reason=why) for i, why in plan.skipped]
    planned = [WriteOutcome(id=i, how=how, verdict=None, reason="") for i, how in plan.steps]
    if body.dry_run or not plan.steps:
        return WorkflowRequeued(
            root=job_id, dry_run=body.dry_run, requeued=0, rewaited=0, would_requeue=len(planned),
            would_rewait=plan.rewaits, skipped=skipped, jobs=planned,
        )  # fmt: skip
    events = requeue_events(
        plan, root=job_id, reason=body.reason, now_ms=ctx.writer.now_ms(), source=SOURCE,
        new_id=new_id,
    )  # fmt: skip
    outcomes = await _write(ctx, events)
    how = dict(plan.steps)
    applied = [o for o in outcomes if o.verdict in (Verdict.APPLIED, Verdict.DUPLICATE)]
    return WorkflowRequeued(
        root=job_id,
        dry_run=False,
        requeued=len(applied),
        rewaited=sum(how[o.id] == "rewait" for o in applied),
        would_requeue=len(planned),
        would_rewait=plan.rewaits,
        skipped=skipped,
        jobs=[o.model_copy(update={"how": how[o.id]}) for o in outcomes],
    )


def _graph(ctx: Ctx, job_id: str, limit: int) -> WorkflowGraph:
    if reader.job(ctx.replica, job_id) is None:
        raise ApiError(404, "not_found", f"no job {job_id!r}")
    return read_graph(job_id, lambda j: reader.job(ctx.replica, j), limit=limit)


def _whole(ctx: Ctx, job_id: str) -> WorkflowGraph:
    graph = _graph(ctx, job_id, OPERATION_LIMIT)
    if graph.truncated:
        why = f"the workflow has more than {graph.node_limit} jobs"
        raise ApiError(409, "workflow_too_big", why)
    return graph


async def _write(ctx: Ctx, events: Sequence[JobCancelled | JobRequeued]) -> list[WriteOutcome]:
    """Write ``events`` in one transaction; each one's verdict as this replica folded it."""
    if not events:
        return []
    deadline = ctx.writer.deadline()
    where = f"/v1/jobs/{events[0].job_id}/workflow"
    appended = await ctx.writer.send(write_atomically(ctx.client, events), "workflow", where)
    outcomes: list[WriteOutcome] = []
    for event, at in zip(events, appended, strict=True):
        entry = await ctx.writer.entry_at(event.job_id, at, deadline)
        outcomes.append(
            WriteOutcome(
                id=event.job_id,
                how=None,
                verdict=None if entry is None else entry.verdict,
                reason=f"written at p{at.partition}@{at.offset}, not yet applied here"
                if entry is None
                else entry.reason,
            )
        )
    return outcomes
