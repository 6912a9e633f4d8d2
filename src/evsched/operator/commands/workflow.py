"""``evsched workflow ID``: a workflow's graph from the caught-up local replica; ``workflow cancel``
and ``workflow requeue`` act on every job of it, in one transaction, and report the verdicts.

The graph is read by ``core.workflow.graph`` and the jobs to touch are chosen by
``core.workflow.ops``: the same code the HTTP API's ``/v1/jobs/{id}/workflow`` routes run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer.core import TyperGroup

from evsched.adapters.clock import monotonic_s, now_ms
from evsched.adapters.ids import new_id
from evsched.client import App
from evsched.client.workflow_ops import Tally, cancel_events, requeue_events, tally
from evsched.client.workflows import write_atomically
from evsched.commands import SOURCE
from evsched.core.events import Event, JobCancelled, JobRequeued
from evsched.core.workflow import graph as workflow_graph
from evsched.core.workflow.graph import DEFAULT_NODE_LIMIT, MAX_NODE_LIMIT, WorkflowGraph
from evsched.core.workflow.ops import RequeuePlan, cancel_plan, requeue_plan
from evsched.operator.commands.writing import Reason, write
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.render import emit_json, out
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S, LocalIndex
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    Offline,
    ReplicaOptions,
    TimeoutS,
    refresh_to,
    replica,
    run,
)
from evsched.operator.workflow_render import graph_table
from evsched.operator.writes import Judged
from evsched.settings import Settings

JobId = Annotated[str, typer.Argument(help="Any job of the workflow.", show_default=False)]
Limit = Annotated[
    int,
    typer.Option(
        "--limit", min=1, max=MAX_NODE_LIMIT, help="Show at most this many jobs (truncated)."
    ),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Only say what would be requeued.")]
# How often a requeue looks again while a workflow settles (its ends reach its children).
SETTLE_POLL_S = 0.2


class _ShowByDefault(TyperGroup):
    """``evsched workflow ID`` is ``evsched workflow show ID``: a first argument that names no
    subcommand is a job id."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: click's Context
        first = next((a for a in args if not a.startswith("-")), None)
        if first is not None and first not in self.commands:
            args = ["show", *args]
        return super().parse_args(ctx, args)


def workflow_app() -> typer.Typer:
    workflow = typer.Typer(
        cls=_ShowByDefault,
        no_args_is_help=True,
        help="Workflows: `evsched workflow ID` shows the graph of ID's workflow.",
    )
    workflow.command("show")(show)
    workflow.command("cancel")(cancel)
    workflow.command("requeue")(requeue)
    return workflow


def _options(data_dir: Any, offline: bool, timeout_s: float, as_json: bool) -> ReplicaOptions:
    return ReplicaOptions(data_dir=data_dir, offline=offline, timeout_s=timeout_s, quiet=as_json)


def read_workflow(local: LocalIndex, job: str, limit: int) -> WorkflowGraph:
    """The graph of ``job``'s workflow from the local replica; NOT_FOUND without such a job."""
    if not job or local.index_of(job).job(job) is None:
        raise OperatorError(ExitCode.NOT_FOUND, f"no job {job!r} in the replica")
    return workflow_graph.read_graph(job, lambda j: local.index_of(j).job(j), limit=limit)


def _whole(local: LocalIndex, job: str) -> WorkflowGraph:
    graph = read_workflow(local, job, MAX_NODE_LIMIT)
    if graph.truncated:
        why = f"the workflow of {job} has more than {MAX_NODE_LIMIT} jobs: nothing was written"
        raise OperatorError(ExitCode.USAGE, why)
    return graph


def show(
    *,
    job: JobId,
    limit: Limit = DEFAULT_NODE_LIMIT,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Show the graph of JOB's workflow: every job reachable through parents and children, with
    its status and what released it (the parent's end, partition@offset) or what it waits on."""

    async def main() -> None:
        async with replica(_options(data_dir, offline, timeout_s, as_json)) as local:
            graph = read_workflow(local, job, limit)
        if as_json:
            emit_json(workflow_graph.as_json(graph))
        else:
            out.print(graph_table(graph))

    run(main)


async def _atomic(app: App, events: Sequence[tuple[str, Event]]) -> list[Judged]:
    """Write every event in one Kafka transaction (all or none)."""
    appended = await write_atomically(app, [event for _, event in events])
    return [
        Judged(entity_id=entity, kind=type(event).__name__, appended=at)
        for (entity, event), at in zip(events, appended, strict=True)
    ]


async def _write_all(
    events: Sequence[JobCancelled | JobRequeued], options: ReplicaOptions
) -> Tally:
    """Write ``events`` in one transaction; the verdicts of the caught-up replica, counted."""
    if not events:
        return Tally()
    pairs: list[tuple[str, Event]] = [(e.job_id, e) for e in events]
    app = App(Settings.from_env(), name="operator")
    judged = await write(app, pairs, options, wait=True, publish=_atomic)
    return tally([(j.entity_id, j.verdict, j.reading) for j in judged])


def cancel(
    *,
    job: JobId,
    reason: Reason = "",
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Cancel every job of JOB's workflow that has not ended (children first, one transaction);
    children waiting on a cancelled parent follow their rule. Repeating it cancels nothing."""
    options = _options(data_dir, False, timeout_s, as_json)

    async def main() -> ExitCode:
        async with replica(options) as local:
            plan = cancel_plan(_whole(local, job))
        events = cancel_events(
            plan, root=job, reason=reason, now_ms=now_ms(), source=SOURCE, new_id=new_id
        )
        counted = await _write_all(events, options)
        finished = len(plan.finished) + len(counted.refused)
        if as_json:
            emit_json(
                {"root": job, "cancelled": counted.applied, "already_finished": finished,
                 "not_confirmed": counted.unknown, "missing": list(plan.missing)}
            )  # fmt: skip
            return ExitCode.OK
        out.print(
            f"workflow of {escape(job)}: {len(counted.applied)} job(s) cancelled, "
            f"{finished} already finished"
            + (f", {len(counted.unknown)} not confirmed" if counted.unknown else "")
            + (f", {len(plan.missing)} missing" if plan.missing else "")
        )
        return ExitCode.OK

    run(main)


def requeue(
    *,
    job: JobId,
    dry_run: DryRun = False,
    reason: Reason = "",
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Requeue the dead and cancelled jobs of JOB's workflow (its failed branches), in one
    transaction: a child cancelled because a parent failed waits again for it, so the parent's
    next success releases it and the rest of the workflow continues."""
    options = _options(data_dir, False, timeout_s, as_json)

    async def main() -> ExitCode:
        plan = await _settled_plan(job, options)
        if dry_run or not plan.steps:
            _print_plan(job, plan, as_json)
            return ExitCode.OK
        events = requeue_events(
            plan, root=job, reason=reason, now_ms=now_ms(), source=SOURCE, new_id=new_id
        )
        counted = await _write_all(events, options)
        _print_requeued(job, plan, counted, as_json)
        return ExitCode.REFUSED if counted.refused else ExitCode.OK

    run(main)


async def _settled_plan(job: str, options: ReplicaOptions) -> RequeuePlan:
    """The requeue plan once every end of the workflow reached its children (a late resolution
    would cancel a child again), looking again until the timeout."""
    deadline = monotonic_s() + options.timeout_s
    async with replica(options) as local:
        while True:
            plan = requeue_plan(_whole(local, job))
            if not plan.settling:
                return plan
            if monotonic_s() >= deadline:
                why = f"the workflow is settling: {plan.settling[0]}; nothing was written"
                raise OperatorError(ExitCode.UNAVAILABLE, why)
            await asyncio.sleep(SETTLE_POLL_S)
            await refresh_to(options, local, {})


def _print_plan(job: str, plan: RequeuePlan, as_json: bool) -> None:
    if as_json:
        emit_json(
            {"root": job, "would_requeue": [{"id": i, "how": how} for i, how in plan.steps],
             "skipped": [{"id": i, "reason": why} for i, why in plan.skipped]}
        )  # fmt: skip
        return
    out.print(
        f"workflow of {escape(job)}: {len(plan.steps)} job(s) would be requeued, "
        f"{plan.rewaits} of them to wait again on their parents"
    )
    for job_id, how in plan.steps:
        out.print(f"  {escape(job_id)}: {how}")
    _print_skipped(plan)


def _print_skipped(plan: RequeuePlan) -> None:
    for job_id, why in plan.skipped:
        out.print(f"  {escape(job_id)}: left as it is ({escape(why)})")


def _print_requeued(job: str, plan: RequeuePlan, counted: Tally, as_json: bool) -> None:
    how = dict(plan.steps)
    rewaited = sum(how[j] == "rewait" for j in counted.applied)
    if as_json:
        emit_json(
            {"root": job, "requeued": counted.applied, "rewaited": rewaited,
             "refused": [{"id": i, "reason": why} for i, why in counted.refused],
             "not_confirmed": counted.unknown,
             "skipped": [{"id": i, "reason": why} for i, why in plan.skipped]}
        )  # fmt: skip
        return
    out.print(
        f"workflow of {escape(job)}: {len(counted.applied)} job(s) requeued, {rewaited} of them "
        "waiting again on their parents"
    )
    for job_id, why in counted.refused:
        out.print(f"  {escape(job_id)}: [red]refused[/red] — {escape(why)}")
    _print_skipped(plan)
