"""``evsched queues limit NAME --max-running N --rate N/<window> [--key]`` (or ``--remove``): a
queue's (or a concurrency key's) global limits, written to its home partition first and then to
every other one; with ``--wait`` each partition's verdict is shown, read back from the replica."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from evsched.adapters.clock import now_ms
from evsched.client import App
from evsched.client.limits import limit_event, publish_limit
from evsched.core.events import Event, KeyLimitSet, QueueLimitSet, entity_id
from evsched.errors import InvalidEnqueue
from evsched.operator.cmd_controls import QueueName
from evsched.operator.cmd_write import Reason, Wait, report, write
from evsched.operator.exits import ExitCode
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    ReplicaOptions,
    TimeoutS,
    run,
)
from evsched.operator.writes import Judged
from evsched.settings import Settings

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
