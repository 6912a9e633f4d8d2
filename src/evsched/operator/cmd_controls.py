"""Pause and resume: ``evsched queues pause|resume|show`` and ``evsched schedules pause|resume``.

A queue's control is written to every events partition; with ``--wait`` each partition's verdict
is shown, read back from the caught-up local replica.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from rich.markup import escape

from evsched.adapters.clock import now_ms
from evsched.client import App
from evsched.client.controls import control_event
from evsched.core.controls import QUEUE
from evsched.core.events import (
    ControlEvent,
    Event,
    QueuePaused,
    QueueResumed,
    SchedulePaused,
    ScheduleResumed,
)
from evsched.errors import InvalidEnqueue
from evsched.operator.cmd_write import Reason, Wait, report, write
from evsched.operator.exits import ExitCode
from evsched.operator.readings import iso
from evsched.operator.render import emit_json, out
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    ReplicaOptions,
    TimeoutS,
    replica,
    run,
)
from evsched.operator.writes import Judged, bad
from evsched.settings import Settings

QueueName = Annotated[str, typer.Argument(help="The queue ([A-Za-z0-9._-]).")]
ScheduleId = Annotated[str, typer.Argument(help="The schedule's id.")]


def queues_pause(
    *,
    queue: QueueName,
    reason: Reason = "",
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Pause a queue on every partition: no new leases; running jobs finish."""
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)
    _queue_control(_event(QueuePaused, queue, reason), wait=wait, options=options, as_json=as_json)


def queues_resume(
    *,
    queue: QueueName,
    reason: Reason = "",
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Resume a paused queue: its due jobs are leased again."""
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)
    _queue_control(_event(QueueResumed, queue, reason), wait=wait, options=options, as_json=as_json)


def queues_show(
    *,
    queue: QueueName,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Whether a queue is paused, per events partition."""
    _event(QueuePaused, queue, "")  # checks the name
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        async with replica(options) as local:
            rows = []
            for partition, index in sorted(local.indexes.items()):
                state = index.control(QUEUE, queue)
                paused = state is not None and state.paused
                since = "" if state is None else iso(state.changed_at)
                reason = "" if state is None else state.reason
                rows.append({"partition": partition, "paused": paused, "since": since,
                             "reason": reason})  # fmt: skip
        if as_json:
            emit_json({"queue": queue, "partitions": rows})
        for row in [] if as_json else rows:
            state_text = f"paused since {row['since']}" if row["paused"] else "running"
            why = f" ({escape(str(row['reason']))})" if row["reason"] else ""
            out.print(f"{escape(queue)} p{row['partition']}: {state_text}{why}")
        return ExitCode.OK

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
        _event(SchedulePaused, schedule_id, reason),
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
    """Resume a paused schedule; of the slots missed while paused, at most the latest fires."""
    _schedule_control(
        _event(ScheduleResumed, schedule_id, reason),
        wait=wait,
        options=ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json),
        as_json=as_json,
    )


def _event(kind: type[ControlEvent], name: str, reason: str) -> ControlEvent:
    try:
        return control_event(kind, name, reason=reason, now_ms=now_ms())
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None


def _schedule_control(
    event: ControlEvent, *, wait: bool, options: ReplicaOptions, as_json: bool
) -> None:
    async def main() -> ExitCode:
        name = event.schedule_id if isinstance(event, SchedulePaused | ScheduleResumed) else ""
        app = App(Settings.from_env(), name="operator")
        judged = await write(app, [(name, event)], options, wait=wait, must_exist=[name] * wait)
        return report(judged, as_json)

    run(main)


def _queue_control(
    event: ControlEvent, *, wait: bool, options: ReplicaOptions, as_json: bool
) -> None:
    async def everywhere(app: App, events: Sequence[tuple[str, Event]]) -> list[Judged]:
        ((queue, control),) = events
        assert isinstance(control, QueuePaused | QueueResumed)
        appended = await app.publish_control_everywhere(control)
        return [Judged(entity_id=queue, kind=type(control).__name__, appended=a) for a in appended]

    async def main() -> ExitCode:
        assert isinstance(event, QueuePaused | QueueResumed)
        app = App(Settings.from_env(), name="operator")
        judged = await write(app, [(event.queue, event)], options, wait=wait, publish=everywhere)
        return report(judged, as_json)

    run(main)
