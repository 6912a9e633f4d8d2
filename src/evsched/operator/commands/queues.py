"""``evsched queues pause|resume|show|limit|partitions``: a queue's controls, limits and dispatch
partitions.

A queue's control (pause, resume) is written to every events partition; its limits (``limit NAME
--max-running N --rate N/<window> [--key]``, or ``--remove``: a queue's or a concurrency key's
global limits) to its home partition first and then to every other one; with ``--wait`` each
partition's verdict is shown, read back from the caught-up local replica.

``partitions NAME --count N`` adds partitions to a live queue's dispatch topic. Nodes and workers
keep running: nodes spread dispatch records over the new partitions once their producers' metadata
shows them, and the queue's worker pools rebalance onto them, reading each new partition from its
first record, so nothing written there before a pool noticed it is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer
from rich.markup import escape

from evsched.adapters.clock import now_ms
from evsched.adapters.kafka.topic_growth import ShrinkRefused, grow_partitions
from evsched.adapters.kafka.topics import TopicMissing, Topics
from evsched.client import App
from evsched.client.limits import limit_event, publish_limit
from evsched.core.bounds import queue_refusal
from evsched.core.controls import QUEUE
from evsched.core.events import (
    ControlEvent,
    Event,
    KeyLimitSet,
    QueueLimitSet,
    QueuePaused,
    QueueResumed,
    entity_id,
)
from evsched.errors import InvalidEnqueue
from evsched.operator.commands.writing import Reason, Wait, report, write
from evsched.operator.exits import ExitCode, OperatorError
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
from evsched.operator.writes import Judged, checked_control
from evsched.settings import Settings

QueueName = Annotated[str, typer.Argument(help="The queue ([A-Za-z0-9._-]).")]
MaxRunning = Annotated[
    int | None,
    typer.Option(
        "--max-running",
        help="At most this many of the queue's jobs leased or running at once, over all nodes.",
    ),
]
Rate = Annotated[
    str | None,
    typer.Option(
        "--rate", help="At most N permits granted per window, e.g. 100/60s, 5/1s, 10/500ms, 600/1h."
    ),
]
IsKey = Annotated[
    bool, typer.Option("--key", help="NAME is a concurrency key (task.options(concurrency_key=)).")
]
Remove = Annotated[bool, typer.Option("--remove", help="Remove the limits.")]
_PARAMETERS = {"max_running": "--max-running", "rate_starts": "--rate", "rate_per_ms": "--rate",
               "queue": "NAME", "key": "NAME", "reason": "--reason"}  # fmt: skip
_UNITS_MS = {"ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000}
Count = Annotated[
    int,
    typer.Option(
        "--count",
        min=1,
        max=10_000,
        help="The partitions the queue's dispatch topic has afterwards (never fewer than now).",
    ),
]


def queues_app() -> typer.Typer:
    queues = typer.Typer(
        no_args_is_help=True,
        help="Queues: pause, resume, concurrency limits and dispatch partitions.",
    )
    queues.command("pause")(queues_pause)
    queues.command("resume")(queues_resume)
    queues.command("show")(queues_show)
    queues.command("limit")(queues_limit)
    queues.command("partitions")(queues_partitions)
    return queues


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
    _queue_control(
        checked_control(QueuePaused, queue, reason), wait=wait, options=options, as_json=as_json
    )


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
    _queue_control(
        checked_control(QueueResumed, queue, reason), wait=wait, options=options, as_json=as_json
    )


def queues_show(
    *,
    queue: QueueName,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Whether a queue is paused, per events partition."""
    checked_control(QueuePaused, queue, "")  # checks the name
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


def parse_rate(text: str) -> tuple[int, int]:
    """``N/<number><unit>`` as (starts, per_ms); BadParameter naming what is wrong."""
    starts, _, window = text.partition("/")
    number = window.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = window[len(number) :] or "s"
    if not starts.isdigit() or not number.isdigit() or unit not in _UNITS_MS:
        raise typer.BadParameter(
            f"{text!r}: expected N/<window>, e.g. 100/60s (units: ms, s, m, h)", param_hint="--rate"
        )
    return int(starts), int(number) * _UNITS_MS[unit]


def queues_limit(
    *,
    queue: QueueName,
    max_running: MaxRunning = None,
    rate: Rate = None,
    key: IsKey = False,
    remove: Remove = False,
    reason: Reason = "",
    wait: Wait = True,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Limit how many of a queue's (or a concurrency key's) jobs run at once, and how many start
    per window, over every node and partition.

    The home partition's index keeps the limit's settings for good and its permit steps
    (request, grant, release) for 7 days of log time; older steps are on the events log or in
    an archive (evsched export, evsched archive)."""
    if (max_running is None and rate is None) == (not remove):
        raise typer.BadParameter(
            "give --max-running N and/or --rate N/<window>, or --remove alone",
            param_hint="--max-running",
        )
    window = None if rate is None else parse_rate(rate)
    try:
        event = limit_event(
            queue, key=key, max_running=max_running, rate=window, reason=reason, now_ms=now_ms()
        )
    except InvalidEnqueue as exc:
        hint = _PARAMETERS.get(exc.field, exc.field)
        raise typer.BadParameter(exc.reason, param_hint=hint) from None
    options = ReplicaOptions(data_dir=data_dir, timeout_s=timeout_s, quiet=as_json)

    async def everywhere(app: App, events: Sequence[tuple[str, Event]]) -> list[Judged]:
        ((name, limit),) = events
        assert isinstance(limit, QueueLimitSet | KeyLimitSet)
        appended = await publish_limit(await app.event_log(), app.topics.events, limit)
        return [Judged(entity_id=name, kind=type(limit).__name__, appended=a) for a in appended]

    async def main() -> ExitCode:
        app = App(Settings.from_env(), name="operator")
        written = [(entity_id(event), event)]
        return report(await write(app, written, options, wait=wait, publish=everywhere), as_json)

    run(main)


def queues_partitions(*, queue: QueueName, count: Count, as_json: Json = False) -> None:
    """Grow a queue's dispatch topic to COUNT partitions while nodes and workers run, so more
    workers of a pool take its jobs at once. Kafka cannot remove partitions: fewer is refused."""
    if (refusal := queue_refusal(queue)) is not None:
        raise typer.BadParameter(refusal, param_hint="NAME")

    async def main() -> ExitCode:
        settings = Settings.from_env()
        topic = Topics(settings.namespace).dispatch(queue)
        try:
            growth = await grow_partitions(settings, topic, count)
        except TopicMissing:
            raise OperatorError(
                ExitCode.NOT_FOUND,
                f"queue {queue!r} is not declared ({topic} does not exist): create it with "
                f"`evsched kafka topics --queue {queue}`",
            ) from None
        except ShrinkRefused as exc:
            raise OperatorError(ExitCode.USAGE, str(exc)) from None
        if as_json:
            emit_json({"topic": growth.topic, "before": growth.before, "after": growth.after})
        elif growth.after == growth.before:
            out.print(f"{topic} already has {growth.after} partitions")
        else:
            out.print(f"{topic}: {growth.before} -> {growth.after} partitions")
        return ExitCode.OK

    run(main)
