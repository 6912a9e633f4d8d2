"""Running an operator command: its coroutine, the replica it reads, errors as exit codes."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)

from evsched.adapters.proofs import node_keyring_from_env
from evsched.errors import EvschedError
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.render import err
from evsched.operator.replica_dir import (
    DEFAULT_TIMEOUT_S,
    LocalIndex,
    catch_up,
    open_offline,
    refresh,
)
from evsched.settings import Settings, SettingsError

DEFAULT_DATA_DIR = Path("./evsched-data/replica")
# Catch-ups shorter than this many records show no progress bar.
PROGRESS_FROM = 20_000

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir",
        envvar="EVSCHED_REPLICA_DATA_DIR",
        help="The local replica's indexes, caught up to the log end before answering.",
    ),
]
Offline = Annotated[
    bool,
    typer.Option("--offline", help="Answer from the local replica as it is, without Kafka."),
]
TimeoutS = Annotated[
    float,
    typer.Option("--timeout-s", min=0.1, help="Give up catching up the replica after this long."),
]
Json = Annotated[bool, typer.Option("--json", help="One JSON document on stdout, for scripts.")]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaOptions:
    """Where the local replica lives and how it is brought up to date."""

    data_dir: Path = DEFAULT_DATA_DIR
    offline: bool = False
    timeout_s: float = DEFAULT_TIMEOUT_S
    quiet: bool = False


def read_options(data_dir: Path, offline: bool, timeout_s: float, as_json: bool) -> ReplicaOptions:
    return ReplicaOptions(data_dir=data_dir, offline=offline, timeout_s=timeout_s, quiet=as_json)


def progress_bar(what: str) -> Progress:
    """A transient progress bar on stderr."""
    return Progress(
        TextColumn(f"{what} [progress.description]{{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )


class _CatchUpBar:
    """Shows a bar only for long catch-ups, so quick reads print nothing extra."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Progress | None = None
        self.task = TaskID(0)

    def __call__(self, done: int, total: int) -> None:
        if self.quiet or total < PROGRESS_FROM:
            return
        if self.bar is None:
            self.bar = progress_bar("catching up the replica")
            self.bar.start()
            self.task = self.bar.add_task("", total=total)
        self.bar.update(self.task, completed=done)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


async def open_replica(
    options: ReplicaOptions, *, at_least: Mapping[int, int] | None = None
) -> LocalIndex:
    """The local replica, caught up (or as it is, offline); the caller closes it."""
    if options.offline:
        return open_offline(options.data_dir)
    bar = _CatchUpBar(options.quiet)
    try:
        return await catch_up(
            Settings.from_env(),
            options.data_dir,
            at_least=at_least,
            timeout_s=options.timeout_s,
            progress=bar,
            keyring=node_keyring_from_env(),
        )
    finally:
        bar.close()


@asynccontextmanager
async def replica(
    options: ReplicaOptions, *, at_least: Mapping[int, int] | None = None
) -> AsyncIterator[LocalIndex]:
    """``open_replica`` as a context that closes it."""
    local = await open_replica(options, at_least=at_least)
    try:
        yield local
    finally:
        local.close()


async def refresh_to(
    options: ReplicaOptions, local: LocalIndex, at_least: Mapping[int, int]
) -> None:
    """Fold what was written since ``local`` caught up, at least up to ``at_least``."""
    await refresh(Settings.from_env(), local, at_least=at_least, timeout_s=options.timeout_s)


def run(main: Callable[[], Awaitable[ExitCode | None]]) -> None:
    """Run a command's coroutine; evsched errors (Kafka's too) end it with their exit code."""
    guarded(lambda: asyncio.run(_call(main)))


def guarded(main: Callable[[], ExitCode | None]) -> None:
    """Run a command's body; its exit code, or the exit code of the evsched error it raised."""
    if not os.environ.get("EVSCHED_DEBUG"):
        # The Kafka client logs every retry while a broker is down (through logging's last
        # resort, to stderr): the operator gets evsched's one line about it instead.
        kafka_log = logging.getLogger("aiokafka")
        kafka_log.addHandler(logging.NullHandler())
        kafka_log.propagate = False
    try:
        code = main()
    except OperatorError as exc:
        err.print(f"[red]error:[/red] {escape(exc.message)}", soft_wrap=True)
        raise typer.Exit(int(exc.code)) from None
    except SettingsError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(int(ExitCode.USAGE)) from None
    except (EvschedError, OSError) as exc:  # BrokerUnavailable is how Kafka's failures arrive
        err.print(f"[red]error:[/red] {escape(str(exc) or type(exc).__name__)}", soft_wrap=True)
        raise typer.Exit(int(ExitCode.UNAVAILABLE)) from None
    except KeyboardInterrupt:
        err.print("[red]interrupted[/red]")
        raise typer.Exit(130) from None
    except Exception as exc:
        # An operator gets one line, not a traceback, whatever went wrong (A.1 of issue 9).
        if os.environ.get("EVSCHED_DEBUG"):
            raise
        err.print(f"[red]error:[/red] {_internal(exc)}", soft_wrap=True)
        raise typer.Exit(int(ExitCode.INTERNAL)) from None
    if code not in (None, ExitCode.OK):
        raise typer.Exit(int(code))


def _internal(exc: Exception) -> str:
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    text = " ".join(str(exc).split())[:300]
    detail = f"{name}: {text}" if text else name
    return f"internal error ({escape(detail)}); EVSCHED_DEBUG=1 shows the traceback"


async def _call(main: Callable[[], Awaitable[ExitCode | None]]) -> ExitCode | None:
    return await main()
