"""Write commands: enqueue by task name, cancel, requeue, requeue dead letters, edit schedules."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

import typer
from rich.markup import escape

from evsched.adapters.clock import now_ms
from evsched.adapters.ids import new_id
from evsched.adapters.kafka.queues import KafkaQueues, undeclared
from evsched.client import App
from evsched.client.loader import load_app
from evsched.commands import SOURCE, EnqueueOptions, check_id, resolve_run_at
from evsched.core.events import Event, JobCancelled, JobRequeued, ScheduleDeleted
from evsched.core.state import Status
from evsched.errors import InvalidEnqueue
from evsched.operator.cmd_read import QueueFilter, TaskFilter, find_jobs
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.render import emit_json, out, verdict_text
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S, LocalIndex
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    ReplicaOptions,
    TimeoutS,
    open_replica,
    refresh_to,
    replica,
    run,
)
from evsched.operator.writes import (
    Judged,
    TaskChoice,
    bad,
    enqueue_event,
    highest_offsets,
    judge,
    parse_args,
    parse_run_at,
    publish,
    resolve_spec,
    schedule_event,
    template_for,
    unique_option,
)
from evsched.settings import Settings, SettingsError

Wait = Annotated[
    bool,
    typer.Option("--wait/--no-wait", help="Wait for the fold's verdict on the write and show it."),
]
AppRef = Annotated[
    str | None,
    typer.Option(
        "--app", help="Your App as module:attribute: task defaults and signature from it."
    ),
]
ArgsJson = Annotated[str | None, typer.Argument(help="Positional args as a JSON array.")]
KwargsJson = Annotated[
    str | None, typer.Option("--kwargs", help="Keyword arguments as a JSON object.")
]
Queue = Annotated[str | None, typer.Option("--queue", help="Queue (default: the task's).")]
Priority = Annotated[int | None, typer.Option("--priority", help="Dispatch priority.")]
MaxAttempts = Annotated[
    int | None, typer.Option("--max-attempts", min=1, help="Attempts allowed (task default: 3).")
]
JobTimeout = Annotated[
    float | None,
    typer.Option("--job-timeout-s", min=0.001, help="Handler timeout (task default: 300 s)."),
]
Reason = Annotated[str, typer.Option("--reason", help="Recorded with the event.")]
DelayS = Annotated[float | None, typer.Option("--delay-s", min=0, help="Start after this long.")]
# Writes (id, event) pairs and returns each with where it was appended.
Publish = Callable[[App, Sequence[tuple[str, Event]]], Awaitable[list[Judged]]]
RunAt = Annotated[
    str | None, typer.Option("--run-at", help="Start at this ISO 8601 time with a zone.")
]


def _app(app_ref: str | None) -> App:
    try:
        return load_app(app_ref) if app_ref else App(Settings.from_env(), name="operator")
    except SettingsError as exc:
        raise typer.BadParameter(str(exc)) from None


async def write(
    app: App,
    events: Sequence[tuple[str, Event]],
    options: ReplicaOptions,
    *,
    wait: bool,
    must_exist: Sequence[str] = (),
    publish: Publish = publish,
) -> list[Judged]:
    """Publish ``events`` (with ``publish``); with ``wait``, their verdicts from the caught-up
    replica.

    Ids in ``must_exist`` are looked up first: an unknown one ends the command (NOT_FOUND)
    before anything is written.
    """
    local = await open_replica(options) if wait or must_exist else None
    try:
        if local is not None:
            _check_known(local, must_exist)
        async with app:
            written = await publish(app, events)
        if local is None or not wait:
            return written
        await refresh_to(options, local, highest_offsets(written))
        return judge(local, written)
    finally:
        if local is not None:
            local.close()


def _check_known(local: LocalIndex, ids: Sequence[str]) -> None:
    missing = [i for i in ids if not local.index_of(i).timeline(i)]
    if missing:
        raise OperatorError(ExitCode.NOT_FOUND, f"unknown in the replica: {', '.join(missing)}")


def report(judged: Sequence[Judged], as_json: bool) -> ExitCode:
    """Print each write and its verdict; REFUSED when the fold did not accept one of them."""
    if as_json:
        emit_json([item.as_json() for item in judged])
    for item in [] if as_json else judged:
        where = f"p{item.appended.partition}@{item.appended.offset}"
        line = f"{item.kind} {escape(item.entity_id)} → {where}"
        if item.verdict is None:
            out.print(f"{line}: written")
        else:
            out.print(line + ": ", verdict_text(item.verdict), f" — {item.reading}", sep="")
    return ExitCode.OK if all(item.accepted for item in judged) else ExitCode.REFUSED


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
    app = _app(app_ref)
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


async def require_declared(app: App, queue: str) -> None:
    """A usage error unless ``queue`` is declared (its dispatch topic exists)."""
    if not await KafkaQueues(app.settings, timeout_s=10.0).declared(queue):
        raise OperatorError(ExitCode.USAGE, undeclared(queue))


def _checked_id(job_id: str) -> str:
    try:
        return check_id("job_id", job_id)
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None


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
        job_id=_checked_id(job),
        emitted_at=now_ms(),
        source=SOURCE,
        reason=reason,
    )
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        must = [job] if wait else []
        judged = await write(_app(None), [(job, event)], options, wait=wait, must_exist=must)
        return report(judged, as_json)

    run(main)


def requeue_event(
    job_id: str, reason: str, delay_s: float | None, run_at: str | None, *, rerun: bool = False
) -> Event:
    now = now_ms()
    try:
        at = resolve_run_at(now, delay_s, parse_run_at(run_at))
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None
    return JobRequeued(
        event_id=new_id(),
        job_id=_checked_id(job_id),
        emitted_at=now,
        source=SOURCE,
        reason=reason,
        run_at=at,
        rerun=rerun,
    )


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
        judged = await write(_app(None), [(job, event)], options, wait=wait, must_exist=must)
        return report(judged, as_json)

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
        judged = await write(_app(None), events, options, wait=True, must_exist=ids)
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


def schedules_upsert(
    *,
    schedule_id: Annotated[str, typer.Argument(help="The schedule's id.")],
    cron: Annotated[str, typer.Argument(help="5 or 6 fields (with seconds).")],
    task: Annotated[str, typer.Argument(help="The task each slot enqueues.")],
    args_json: ArgsJson = None,
    kwargs_json: KwargsJson = None,
    timezone: Annotated[str, typer.Option("--timezone", help="IANA zone of the slots.")] = "UTC",
    queue: Queue = None,
    priority: Priority = None,
    max_attempts: MaxAttempts = None,
    job_timeout_s: JobTimeout = None,
    catchup_window_s: Annotated[
        float | None,
        typer.Option(
            "--catchup-window-s",
            min=0,
            help="Missed slots within this many seconds fire one by one, older ones are "
            "skipped (default: missed slots collapse into one fire).",
        ),
    ] = None,
    max_jitter_s: Annotated[
        float | None,
        typer.Option(
            "--max-jitter-s",
            min=0,
            help="Each job runs up to this many seconds after its slot (deterministic offset).",
        ),
    ] = None,
    overlap: Annotated[
        str | None,
        typer.Option(
            "--overlap",
            help="allow (default), skip or buffer: what a fire does while the previous fire's "
            "job is queued or running.",
        ),
    ] = None,
    app_ref: AppRef = None,
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Create or replace a cron schedule that enqueues TASK at each slot."""
    args, kwargs = parse_args(args_json, kwargs_json)
    app = _app(app_ref)
    choice = TaskChoice(name=task, queue=queue, max_attempts=max_attempts, timeout_s=job_timeout_s)
    spec = resolve_spec(choice, app if app_ref else None, args, kwargs)
    template = template_for(spec, args, kwargs, priority)
    policies = {
        "catchup_window": catchup_window_s,
        "max_jitter": max_jitter_s,
        "overlap": overlap,
    }
    event = schedule_event(schedule_id, cron, timezone, template, now_ms(), policies=policies)
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        await require_declared(app, event.template.queue)
        judged = await write(app, [(schedule_id, event)], options, wait=wait)
        return report(judged, as_json)

    run(main)


def schedules_delete(
    *,
    schedule_id: Annotated[str, typer.Argument(help="The schedule's id.")],
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Delete a cron schedule; slots already fired keep their jobs."""
    try:
        check_id("schedule_id", schedule_id)
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None
    event = ScheduleDeleted(
        event_id=new_id(), schedule_id=schedule_id, emitted_at=now_ms(), source=SOURCE
    )
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        must = [schedule_id] if wait else []
        judged = await write(
            _app(None), [(schedule_id, event)], options, wait=wait, must_exist=must
        )
        return report(judged, as_json)

    run(main)
