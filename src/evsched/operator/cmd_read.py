"""Read commands: a job, lists of jobs, audits (with time travel), dead letters, schedules."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from evsched.core.failures import category_of
from evsched.core.state import JobState, ScheduleState, Status
from evsched.operator.archive_history import audit_from_archive
from evsched.operator.audit import audit
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.readings import purged_line
from evsched.operator.render import (
    audit_json,
    emit_json,
    job_table,
    jobs_table,
    out,
    plain,
    print_audit,
    schedules_table,
)
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S, LocalIndex
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    Offline,
    ReplicaOptions,
    TimeoutS,
    replica,
    run,
)

JobId = Annotated[str, typer.Argument(help="The job id.", show_default=False)]
StatusFilter = Annotated[
    Status | None, typer.Option("--status", help="Only jobs with this status.")
]
QueueFilter = Annotated[str | None, typer.Option("--queue", help="Only jobs of this queue.")]
TaskFilter = Annotated[str | None, typer.Option("--task", help="Only jobs of this task.")]
Limit = Annotated[int, typer.Option("--limit", min=1, help="At most this many jobs.")]


def _options(data_dir: Path, offline: bool, timeout_s: float, as_json: bool) -> ReplicaOptions:
    return ReplicaOptions(data_dir=data_dir, offline=offline, timeout_s=timeout_s, quiet=as_json)


def find_jobs(
    local: LocalIndex,
    *,
    status: Status | None = None,
    queue: str | None = None,
    task: str | None = None,
    limit: int | None = None,
    category: str | None = None,
) -> list[JobState]:
    """Jobs matching every filter given, in id order per partition, stopping at ``limit``."""
    found: list[JobState] = []
    for state in _all_jobs(local):
        if status is not None and state.status is not status:
            continue
        if category is not None and category != _category(state):
            continue
        if (queue is not None and state.queue != queue) or (
            task is not None and state.task != task
        ):
            continue
        found.append(state)
        if limit is not None and len(found) >= limit:
            break
    return found


def _category(state: JobState) -> str | None:
    return None if state.last_error is None else category_of(state.last_error)


def _all_jobs(local: LocalIndex) -> Iterator[JobState]:
    for _, index in sorted(local.indexes.items()):
        yield from index.jobs()


def job_command(
    *,
    job: JobId,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Show one job's current state."""

    async def main() -> None:
        async with replica(_options(data_dir, offline, timeout_s, as_json)) as local:
            state = local.index_of(job).job(job)
        if state is None:
            raise OperatorError(ExitCode.NOT_FOUND, f"no job {job!r} in the replica")
        if as_json:
            emit_json(plain(state))
        else:
            out.print(job_table(state))

    run(main)


def jobs(
    *,
    status: StatusFilter = None,
    queue: QueueFilter = None,
    task: TaskFilter = None,
    limit: Limit = 50,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """List jobs (in id order per partition), filtered by status, queue and task."""

    async def main() -> None:
        async with replica(_options(data_dir, offline, timeout_s, as_json)) as local:
            found = find_jobs(local, status=status, queue=queue, task=task, limit=limit)
        _print_jobs(found, as_json)

    run(main)


def _print_jobs(found: list[JobState], as_json: bool) -> None:
    if as_json:
        emit_json([plain(state) for state in found])
    elif found:
        out.print(jobs_table(found))
    else:
        out.print("no matching jobs")


def audit_command(
    *,
    job: Annotated[str, typer.Argument(help="A job id (or a schedule id).")],
    as_of: Annotated[
        int | None,
        typer.Option("--as-of", min=0, help="Show the state as of this offset of its partition."),
    ] = None,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    archive: Annotated[
        Path | None,
        typer.Option(
            "--archive",
            help="Read the history from this archive (evsched archive --to), then the topic "
            "after it (--offline: the archive alone), instead of the replica.",
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Every event of a job from the index: where, when, who, token, verdict and why."""

    async def main() -> None:
        sources = None
        if archive is not None:
            found, sources = await audit_from_archive(archive, job, offline=offline, as_of=as_of)
        else:
            async with replica(_options(data_dir, offline, timeout_s, as_json)) as local:
                found = audit(local.index_of(job), job, as_of=as_of)
        if found is None:
            where = "the replica" if archive is None else f"the archive {archive}"
            raise OperatorError(ExitCode.NOT_FOUND, f"no events of {job!r} in {where}{_GONE}")
        if as_json:
            emit_json(audit_json(found) | ({} if sources is None else sources.as_json()))
            return
        if sources is not None:
            out.print(sources.describe())
        print_audit(out, found)
        if found.purged is not None:
            out.print(purged_line(found.purged))
        else:
            _print_state_line(found.state, found.as_of)
        for row in found.drifted:
            out.print(
                f"[red]offset {row.entry.offset}: the current fold says {row.refolded}, "
                f"the index recorded {row.entry.verdict}: rebuild the index[/red]"
            )

    run(main)


# A purge's own entry stays for as long as the job's retention again, a rejected event of an
# unknown job as long as its purge mark or 7 days of log time, of an unknown schedule 7 days;
# after that, only the log.
_GONE = (
    " (if it was purged longer ago than its retention period, or its events were rejected ones "
    "of an unknown job or schedule that expired from the index, its history is on the events "
    "log or in an archive of it: evsched export, evsched replay)"
)


def _print_state_line(state: JobState | ScheduleState | None, as_of: int | None) -> None:
    when = "now" if as_of is None else f"as of offset {as_of}"
    if state is None:
        out.print(f"state {when}: [dim]no such job yet[/dim]")
    elif isinstance(state, JobState):
        out.print(f"state {when}:")
        out.print(job_table(state))
    else:
        out.print(f"state {when}:")
        out.print(schedules_table([state]))


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
        async with replica(_options(data_dir, offline, timeout_s, as_json)) as local:
            found = find_jobs(
                local, status=Status.DEAD, queue=queue, task=task, limit=limit, category=category
            )
        if as_json:
            emit_json([{**plain(s), "category": _category(s)} for s in found])
        elif found:
            out.print(jobs_table(found, categories=True))
        else:
            out.print("no matching jobs")

    run(main)


def schedules_list(
    *,
    include_deleted: Annotated[
        bool, typer.Option("--include-deleted", help="Show deleted schedules too.")
    ] = False,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """List cron schedules."""

    async def main() -> None:
        async with replica(_options(data_dir, offline, timeout_s, as_json)) as local:
            found = [
                s
                for _, index in sorted(local.indexes.items())
                for s in index.schedules()
                if include_deleted or not s.deleted
            ]
        if as_json:
            emit_json([plain(s) for s in found])
        elif found:
            out.print(schedules_table(found))
        else:
            out.print("no schedules")

    run(main)
