"""``evsched enqueue|job|jobs|audit|cancel|requeue``: write one job's events, or read jobs and
their audits (with time travel) from the caught-up local replica."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evsched.adapters.clock import now_ms
from evsched.adapters.ids import new_id
from evsched.commands import SOURCE, EnqueueOptions
from evsched.core.events import JobCancelled
from evsched.core.state import JobState, ScheduleState, Status
from evsched.operator.archive_history import audit_from_archive
from evsched.operator.audit import audit
from evsched.operator.commands.job_filters import Limit, QueueFilter, TaskFilter, find_jobs
from evsched.operator.commands.writing import (
    AppRef,
    ArgsJson,
    JobTimeout,
    KwargsJson,
    MaxAttempts,
    Priority,
    Queue,
    Reason,
    Wait,
    operator_app,
    report,
    require_declared,
    write,
)
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
from evsched.operator.writes import (
    TaskChoice,
    checked_id,
    enqueue_event,
    parse_args,
    parse_run_at,
    requeue_event,
    resolve_spec,
    unique_option,
)

JobId = Annotated[str, typer.Argument(help="The job id.", show_default=False)]
StatusFilter = Annotated[
    Status | None, typer.Option("--status", help="Only jobs with this status.")
]
DelayS = Annotated[float | None, typer.Option("--delay-s", min=0, help="Start after this long.")]
RunAt = Annotated[
    str | None, typer.Option("--run-at", help="Start at this ISO 8601 time with a zone.")
]


def enqueue(
    *,
    task: Annotated[str, typer.Argument(help="The task's registered name.")],
    args_json: ArgsJson = None,
    kwargs_json: KwargsJson = None,
    queue: Queue = None,
    delay_s: DelayS = None,
    run_at: RunAt = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option("--idempotency-key", help="Repeats with this key make one job."),
    ] = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    job_timeout_s: JobTimeout = None,
    retention_s: Annotated[
        float | None,
        typer.Option(
            "--retention-s",
            min=0,
            help="Seconds the finished job stays in the index (default: EVSCHED_RETENTION_MS).",
        ),
    ] = None,
    key_window_s: Annotated[
        float | None,
        typer.Option(
            "--key-window-s",
            min=0,
            help="Seconds after the job ends that its key still returns it (default: 24 h).",
        ),
    ] = None,
    unique: Annotated[
        str | None,
        typer.Option(
            "--unique",
            help="queued, active, or a period in seconds: another enqueue of the same task and "
            "args (or key) is a duplicate while the job is queued, queued or running, or for the "
            "period (default: the task's).",
        ),
    ] = None,
    app_ref: AppRef = None,
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Enqueue a job of TASK by name; prints its id and the fold's verdict."""
    args, kwargs = parse_args(args_json, kwargs_json)
    at = parse_run_at(run_at)
    app = operator_app(app_ref)
    choice = TaskChoice(name=task, queue=queue, max_attempts=max_attempts, timeout_s=job_timeout_s)
    spec = resolve_spec(choice, app if app_ref else None, args, kwargs)
    options = EnqueueOptions(
        delay=delay_s,
        run_at=at,
        idempotency_key=idempotency_key,
        priority=priority,
        retention=retention_s,
        key_window=key_window_s,
        unique=unique_option(unique),
    )
    event = enqueue_event(spec, args, kwargs, options, now_ms(), defaults=app.settings)
    replica_options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        await require_declared(app, event.queue)
        judged = await write(app, [(event.job_id, event)], replica_options, wait=wait)
        return report(judged, as_json)

    run(main)


def cancel(
    *,
    job: Annotated[str, typer.Argument(help="The job to cancel.")],
    reason: Reason = "",
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Cancel a job; a running attempt's later completion is then rejected."""
    event = JobCancelled(
        event_id=new_id(),
        job_id=checked_id(job),
        emitted_at=now_ms(),
        source=SOURCE,
        reason=reason,
    )
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        must = [job] if wait else []
        judged = await write(
            operator_app(None), [(job, event)], options, wait=wait, must_exist=must
        )
        return report(judged, as_json)

    run(main)


def requeue(
    *,
    job: Annotated[str, typer.Argument(help="A dead or cancelled job (or succeeded, --rerun).")],
    reason: Reason = "",
    delay_s: DelayS = None,
    run_at: RunAt = None,
    rerun: Annotated[
        bool,
        typer.Option("--rerun", help="Also a succeeded job: run it again (its result is cleared)."),
    ] = False,
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Send a dead or cancelled job back to scheduled, with a fresh attempt budget; with
    --rerun a succeeded job too, to run it again."""
    event = requeue_event(job, reason, delay_s, run_at, rerun=rerun)
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        must = [job] if wait else []
        judged = await write(
            operator_app(None), [(job, event)], options, wait=wait, must_exist=must
        )
        return report(judged, as_json)

    run(main)


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
        async with replica(read_options(data_dir, offline, timeout_s, as_json)) as local:
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
        async with replica(read_options(data_dir, offline, timeout_s, as_json)) as local:
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
            async with replica(read_options(data_dir, offline, timeout_s, as_json)) as local:
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
