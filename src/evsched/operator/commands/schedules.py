"""``evsched schedules list|show|upsert|delete|pause|resume``: cron schedules, read from the
caught-up local replica or written, with the fold's verdicts (``backfill``: schedule_backfill.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from evsched.adapters.clock import now_ms
from evsched.adapters.ids import new_id
from evsched.client import App
from evsched.commands import SOURCE, check_id
from evsched.core.controls import SCHEDULE
from evsched.core.events import (
    ControlEvent,
    ScheduleDeleted,
    SchedulePaused,
    ScheduleResumed,
)
from evsched.errors import InvalidEnqueue
from evsched.operator.commands.schedule_backfill import schedules_backfill
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
from evsched.operator.render import emit_json, out, plain, schedule_table, schedules_table
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
    bad,
    checked_control,
    parse_args,
    resolve_spec,
    schedule_event,
    template_for,
)
from evsched.settings import Settings

ScheduleId = Annotated[str, typer.Argument(help="The schedule's id.")]


def schedules_app() -> typer.Typer:
    schedules = typer.Typer(no_args_is_help=True, help="Cron schedules.")
    schedules.command("list")(schedules_list)
    schedules.command("show")(schedules_show)
    schedules.command("upsert")(schedules_upsert)
    schedules.command("delete")(schedules_delete)
    schedules.command("pause")(schedules_pause)
    schedules.command("resume")(schedules_resume)
    schedules.command("backfill")(schedules_backfill)
    return schedules


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
        async with replica(read_options(data_dir, offline, timeout_s, as_json)) as local:
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


def schedules_show(
    *,
    schedule_id: Annotated[str, typer.Argument(help="The schedule's id.")],
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Show one cron schedule: its job template, policies, slots, and whether it is paused."""

    async def main() -> None:
        async with replica(read_options(data_dir, offline, timeout_s, as_json)) as local:
            index = local.index_of(schedule_id)
            state = index.schedule(schedule_id)
            switch = index.control(SCHEDULE, schedule_id)
        if state is None:
            raise OperatorError(ExitCode.NOT_FOUND, f"no schedule {schedule_id!r} in the replica")
        paused = switch is not None and switch.paused
        if as_json:
            emit_json(plain(state) | {"paused": paused})
        else:
            out.print(schedule_table(state, switch))

    run(main)


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
    app = operator_app(app_ref)
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
            operator_app(None), [(schedule_id, event)], options, wait=wait, must_exist=must
        )
        return report(judged, as_json)

    run(main)


def schedules_pause(
    *,
    schedule_id: ScheduleId,
    reason: Reason = "",
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Pause a cron schedule: no slot fires until it is resumed."""
    _schedule_control(
        checked_control(SchedulePaused, schedule_id, reason),
        wait=wait,
        options=ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json),
        as_json=as_json,
    )


def schedules_resume(
    *,
    schedule_id: ScheduleId,
    reason: Reason = "",
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Resume a paused schedule: of the slots missed while paused, the newest fires, or, with a
    catch-up window, each one within the window, oldest first (older ones are skipped)."""
    _schedule_control(
        checked_control(ScheduleResumed, schedule_id, reason),
        wait=wait,
        options=ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json),
        as_json=as_json,
    )


def _schedule_control(
    event: ControlEvent, *, wait: bool, options: ReplicaOptions, as_json: bool
) -> None:
    async def main() -> ExitCode:
        name = event.schedule_id if isinstance(event, SchedulePaused | ScheduleResumed) else ""
        app = App(Settings.from_env(), name="operator")
        judged = await write(app, [(name, event)], options, wait=wait, must_exist=[name] * wait)
        return report(judged, as_json)

    run(main)
