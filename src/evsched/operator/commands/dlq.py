"""``evsched dlq list|requeue``: the dead-letter queue, its dead jobs listed or requeued."""

from __future__ import annotations

from typing import Annotated

import typer

from evsched.core.state import Status
from evsched.operator.commands.job_filters import (
    Limit,
    QueueFilter,
    TaskFilter,
    failure_category,
    find_jobs,
)
from evsched.operator.commands.writing import Reason, operator_app, report, write
from evsched.operator.exits import ExitCode
from evsched.operator.render import emit_json, jobs_table, out, plain
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    Offline,
    ReplicaOptions,
    TimeoutS,
    read_options,
    replica,
    run,
)
from evsched.operator.writes import requeue_event


def dlq_app() -> typer.Typer:
    dlq = typer.Typer(no_args_is_help=True, help="The dead-letter queue: dead jobs.")
    dlq.command("list")(dlq_list)
    dlq.command("requeue")(dlq_requeue)
    return dlq


def dlq_list(
    *,
    queue: QueueFilter = None,
    task: TaskFilter = None,
    category: Annotated[
        str | None,
        typer.Option(
            "--category",
            help="Only jobs whose last failure is of this category (transient, permanent, "
            "timeout, cancelled, lost_worker, or one the app maps exceptions to).",
        ),
    ] = None,
    limit: Limit = 50,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """List dead jobs (the dead-letter queue) with the category of their last failure."""

    async def main() -> None:
        async with replica(read_options(data_dir, offline, timeout_s, as_json)) as local:
            found = find_jobs(
                local, status=Status.DEAD, queue=queue, task=task, limit=limit, category=category
            )
        if as_json:
            emit_json([{**plain(s), "category": failure_category(s)} for s in found])
        elif found:
            out.print(jobs_table(found, categories=True))
        else:
            out.print("no matching jobs")

    run(main)


def dlq_requeue(
    *,
    jobs: Annotated[list[str] | None, typer.Argument(help="Dead jobs to requeue.")] = None,
    all_dead: Annotated[bool, typer.Option("--all", help="Every dead job (see filters).")] = False,
    queue: QueueFilter = None,
    task: TaskFilter = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only list what would go.")] = False,
    reason: Reason = "",
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Requeue dead jobs: the ones named, or --all of them (filtered by --queue, --task)."""
    if bool(jobs) == all_dead:
        raise typer.BadParameter("give job ids or --all (not both)", param_hint="JOBS / --all")
    if jobs and (queue or task):
        raise typer.BadParameter("filters apply to --all only", param_hint="--queue / --task")
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        ids = list(jobs or [])
        if all_dead:
            async with replica(options) as local:
                dead = find_jobs(local, status=Status.DEAD, queue=queue, task=task)
            ids = [state.job_id for state in dead]
        if dry_run or not ids:
            return _print_plan(ids, as_json)
        events = [(i, requeue_event(i, reason, None, None)) for i in ids]
        judged = await write(operator_app(None), events, options, wait=True, must_exist=ids)
        return report(judged, as_json)

    run(main)


def _print_plan(ids: list[str], as_json: bool) -> ExitCode:
    if as_json:
        emit_json({"would_requeue": ids})
    else:
        out.print(f"{len(ids)} dead job(s) would be requeued" if ids else "no dead jobs")
        for job_id in ids:
            out.print(f"  {job_id}")
    return ExitCode.OK
