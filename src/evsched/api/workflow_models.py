"""The HTTP shapes of workflows: the graph (``core.workflow.graph``'s JSON) and the answers of a
whole workflow's cancel and requeue."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from evsched.api.models import Reason
from evsched.core.state import Verdict


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ParentView(BaseModel):
    """A parent of a job; ``outcome`` null while it has not resolved the job."""

    id: str
    outcome: str | None = Field(
        description="succeeded, dead, cancelled, unknown (no such job) or refused (too many "
        "children); null: not yet."
    )
    partition: int | None = Field(description="Where the parent's end that resolved it is.")
    offset: int | None


class WorkflowNode(BaseModel):
    id: str
    found: bool = Field(description="False for an id no job has here (never enqueued, purged).")
    task: str | None
    queue: str | None
    status: str | None
    attempt: int
    max_attempts: int
    rule: str | None = Field(description="after_rule, for a job with parents.")
    results_to_args: str | None
    parents: list[ParentView]
    children: list[str]
    decided_by: ParentView | None = Field(
        description="The parent's resolution after which the job's rule released it, or could "
        "no longer be met."
    )
    decision: Literal["released", "gave_up"] | None = Field(
        description="released, or gave_up (the job was cancelled); null while it waits or when "
        "it has no parents."
    )


class WorkflowView(BaseModel):
    """The jobs reachable from ``root`` through parents and children, parents first."""

    root: str
    nodes: list[WorkflowNode]
    truncated: bool = Field(description="True when node_limit left jobs out.")
    node_limit: int
    counts: dict[str, int] = Field(description="Jobs per status (missing: ids without a job).")


class WorkflowCancel(_Request):
    reason: Reason = ""


class WorkflowRequeue(_Request):
    reason: Reason = ""
    dry_run: StrictBool = Field(default=False, description="Only say what would be requeued.")


class WriteOutcome(BaseModel):
    """One job of the operation: how it goes back (requeue), and the fold's verdict."""

    id: str
    how: str | None = Field(
        description="requeue: back to scheduled; rewait: back to waiting on its parents; null "
        "for a cancel, or a job left as it is.",
        examples=["rewait"],
    )
    verdict: Verdict | None = Field(description="Null when not written or not yet applied here.")
    reason: str


class WorkflowCancelled(BaseModel):
    root: str
    cancelled: int
    already_finished: int
    not_confirmed: int = Field(description="Written, not yet applied by this replica.")
    missing: list[str] = Field(description="Ids of the workflow without a job here.")
    jobs: list[WriteOutcome]


class WorkflowRequeued(BaseModel):
    root: str
    dry_run: bool
    requeued: int = Field(description="Jobs requeued (rewaited included).")
    rewaited: int = Field(description="Of them, children that wait again on their parents.")
    would_requeue: int
    would_rewait: int
    skipped: list[WriteOutcome] = Field(description="Dead or cancelled jobs left, with why.")
    jobs: list[WriteOutcome]
