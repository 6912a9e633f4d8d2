"""``evsched schedules backfill ID --from --to``: fire a schedule's past slots on request.

Each slot in the range becomes a ``ScheduleFired`` (decision ``backfilled``) and its job's
``JobEnqueued``, with the ids a node would give that slot, so a slot that already fired (or was
backfilled before) makes no second job: its enqueue is a ``duplicate``. The schedule's fold judges
every backfilled fire (a past slot of the expression, before its next due slot) and does not move
the schedule. The range is bounded (``cron_policy.MAX_BACKFILL_SLOTS``).
"""

from __future__ import annotations

import math
from typing import Annotated

import typer

from evsched.adapters.clock import now_ms
from evsched.client import App
from evsched.commands import SOURCE, check_id
from evsched.core import cron_policy, planner
from evsched.core.events import Event
from evsched.core.state import ScheduleState
from evsched.errors import InvalidEnqueue
from evsched.operator.cmd_controls import ScheduleId
from evsched.operator.cmd_write import Wait, report, write
from evsched.operator.exits import ExitCode, OperatorError
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
from evsched.operator.writes import bad, parse_run_at
from evsched.settings import Settings


def schedules_backfill(
    *,
    schedule_id: ScheduleId,
    start: Annotated[str, typer.Option("--from", help="First time of the range (ISO 8601).")],
    end: Annotated[str, typer.Option("--to", help="Last time of the range, included.")],
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Fire every slot of a schedule from --from to --to (past slots only, at most 1000)."""
    try:
        check_id("schedule_id", schedule_id)
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None
    first, last = _ms(start, "--from"), _ms(end, "--to")
    if last < first:
        raise typer.BadParameter("must not be before --from", param_hint="--to")
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        async with replica(options) as local:
            schedule = local.index_of(schedule_id).schedule(schedule_id)
        events = backfill_events(_live(schedule, schedule_id), first, last, now_ms())
        app = App(Settings.from_env(), name="operator")
        judged = await write(app, events, options, wait=wait)
        return report(judged, as_json)

    run(main)


def backfill_events(
    schedule: ScheduleState, first: int, last: int, now: int
) -> list[tuple[str, Event]]:
    """The fires and enqueues of the slots in ``[first, last]``; a usage error when none is
    there, or more than the bound."""
    slots = cron_policy.backfill_slots(schedule, first, last)
    if not slots:
        raise typer.BadParameter(f"no slot of {schedule.cron!r} in the range", param_hint="--to")
    if len(slots) > cron_policy.MAX_BACKFILL_SLOTS:
        raise typer.BadParameter(
            f"the range holds more than {cron_policy.MAX_BACKFILL_SLOTS} slots: split it",
            param_hint="--to",
        )
    events: list[tuple[str, Event]] = []
    for slot in slots:
        fired, job = planner.fire(
            schedule, slot, now=now, source=SOURCE, decision=cron_policy.BACKFILLED
        )
        events.append((schedule.schedule_id, fired))
        if job is not None:
            events.append((job.job_id, job))
    return events


def _live(schedule: ScheduleState | None, schedule_id: str) -> ScheduleState:
    if schedule is None or schedule.deleted:
        raise OperatorError(ExitCode.NOT_FOUND, f"no schedule {schedule_id} in the replica")
    return schedule


def _ms(text: str, option: str) -> int:
    try:
        moment = parse_run_at(text)
    except typer.BadParameter as exc:
        raise typer.BadParameter(exc.message, param_hint=option) from None
    assert moment is not None
    return math.floor(moment.timestamp() * 1000)
