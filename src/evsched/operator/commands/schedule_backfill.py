"""``evsched schedules backfill ID --from --to``: fire a schedule's past slots on request.

Each slot in the range becomes a ``ScheduleFired`` (decision ``backfilled``) and its job's
``JobEnqueued``, with the ids a node would give that slot, so a slot that already fired (or was
backfilled before) makes no second job: its enqueue is a ``duplicate``. The schedule's fold judges
every backfilled fire (a past slot of the expression, before its next due slot, of a schedule not
paused) and does not move the schedule; a job is written only for a fire it accepted. The range
is bounded (``cron_policy.MAX_BACKFILL_SLOTS``).
"""

from __future__ import annotations

import math
from typing import Annotated

import typer

from evsched.adapters.clock import now_ms
from evsched.client import App
from evsched.commands import SOURCE, check_id
from evsched.core import planner
from evsched.core.controls import SCHEDULE, ControlState
from evsched.core.events import JobEnqueued, ScheduleFired
from evsched.core.schedule import policy as cron_policy
from evsched.core.state import ScheduleState
from evsched.errors import InvalidEnqueue
from evsched.operator.commands.writing import Wait, report
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S, LocalIndex
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    ReplicaOptions,
    TimeoutS,
    open_replica,
    refresh_to,
    run,
)
from evsched.operator.writes import (
    ACCEPTED,
    Judged,
    bad,
    highest_offsets,
    judge,
    parse_run_at,
    publish,
)
from evsched.settings import Settings

ScheduleId = Annotated[str, typer.Argument(help="The schedule's id.")]


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
    """Fire every slot of a schedule from --from to --to (past slots only, at most 1000).

    A slot's job is written only once the fold has accepted its fire (--no-wait skips waiting
    for the jobs' verdicts only). A paused schedule is refused (exit 5) and nothing is written.
    """
    try:
        check_id("schedule_id", schedule_id)
    except InvalidEnqueue as exc:
        raise bad(exc.field, exc.reason) from None
    first, last = _ms(start, "--from"), _ms(end, "--to")
    if last < first:
        raise typer.BadParameter("must not be before --from", param_hint="--to")
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def main() -> ExitCode:
        local = await open_replica(options)
        try:
            index = local.index_of(schedule_id)
            schedule = _live(index.schedule(schedule_id), schedule_id)
            _not_paused(index.control(SCHEDULE, schedule_id), schedule_id)
            fires = backfill_fires(schedule, first, last, now_ms())
            async with App(Settings.from_env(), name="operator") as app:
                judged = await backfill(app, local, fires, options, wait=wait)
        finally:
            local.close()
        return report(judged, as_json)

    run(main)


def backfill_fires(
    schedule: ScheduleState, first: int, last: int, now: int
) -> list[tuple[ScheduleFired, JobEnqueued]]:
    """The fire and job of each slot in ``[first, last]``; a usage error when none is there, or
    more than the bound."""
    slots = cron_policy.backfill_slots(schedule, first, last)
    if not slots:
        raise typer.BadParameter(f"no slot of {schedule.cron!r} in the range", param_hint="--to")
    if len(slots) > cron_policy.MAX_BACKFILL_SLOTS:
        raise typer.BadParameter(
            f"the range holds more than {cron_policy.MAX_BACKFILL_SLOTS} slots: split it",
            param_hint="--to",
        )
    fires: list[tuple[ScheduleFired, JobEnqueued]] = []
    for slot in slots:
        fired, job = planner.fire(
            schedule, slot, now=now, source=SOURCE, decision=cron_policy.BACKFILLED
        )
        assert job is not None  # only a missed slot comes without a job
        fires.append((fired, job))
    return fires


async def backfill(
    app: App,
    local: LocalIndex,
    fires: list[tuple[ScheduleFired, JobEnqueued]],
    options: ReplicaOptions,
    *,
    wait: bool,
) -> list[Judged]:
    """Write the fires, then the job of each fire the fold accepted; the writes, judged.

    A fire and its job are separate records (the job is keyed by its own id, on its own
    partition), and a job's enqueue is applied whatever its fire's verdict: a job written with a
    fire the fold rejects (its schedule paused since the replica was read, say) would run all the
    same. So the fires go first, and only an applied (or already applied) fire gets its job.
    """
    fired = await publish(app, [(f.schedule_id, f) for f, _ in fires])
    await refresh_to(options, local, highest_offsets(fired))
    fired = judge(local, fired)
    jobs = [
        (job.job_id, job)
        for (_, job), item in zip(fires, fired, strict=True)
        if item.verdict in ACCEPTED
    ]
    written = await publish(app, jobs)
    if wait and written:
        await refresh_to(options, local, highest_offsets(written))
        written = judge(local, written)
    return [*fired, *written]


def _not_paused(switch: ControlState | None, schedule_id: str) -> None:
    if switch is not None and switch.paused:
        raise OperatorError(
            ExitCode.REFUSED,
            f"schedule {schedule_id} is paused: the fold rejects its fires, backfilled ones too, "
            f"so nothing was written; resume it first (evsched schedules resume {schedule_id})",
        )


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
