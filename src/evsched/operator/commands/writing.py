"""The write step the write commands share: their App, the declared-queue check, the write and
its verdicts' report, and the options those commands share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

import typer
from rich.markup import escape

from evsched.adapters.kafka.queues import KafkaQueues, undeclared
from evsched.client import App
from evsched.client.loader import load_app
from evsched.core.events import Event
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.render import emit_json, out, verdict_text
from evsched.operator.replica_dir import LocalIndex
from evsched.operator.session import ReplicaOptions, open_replica, refresh_to
from evsched.operator.writes import Judged, highest_offsets, judge, publish
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
# Writes (id, event) pairs and returns each with where it was appended.
Publish = Callable[[App, Sequence[tuple[str, Event]]], Awaitable[list[Judged]]]


def operator_app(app_ref: str | None) -> App:
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


async def require_declared(app: App, queue: str) -> None:
    """A usage error unless ``queue`` is declared (its dispatch topic exists)."""
    if not await KafkaQueues(app.settings, timeout_s=10.0).declared(queue):
        raise OperatorError(ExitCode.USAGE, undeclared(queue))
