"""``evsched replay``: fold recorded histories with the current code, compare with the outcome."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from evsched.adapters.archive.files import ArchiveError
from evsched.adapters.archive.history_file import HistoryFileError, read_history
from evsched.adapters.proofs import KEY_FILE_ENV, NodeKeyring, node_keyring_from_env
from evsched.core.fold import FOLD_VERSION
from evsched.operator.archive_history import archive_history
from evsched.operator.commands.export import check_selection
from evsched.operator.commands.replay_decisions import (
    Judged,
    Overrides,
    judge_archive,
    judge_history,
    judge_live,
    print_judged,
)
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.export import LogRange
from evsched.operator.render import emit_json, err, out
from evsched.operator.replay import (
    Outcome,
    dump_expected,
    expected_document,
    expected_path,
    fold_history,
)
from evsched.operator.replay_check import Comparison, compare
from evsched.operator.session import Json, guarded

HISTORY_SUFFIX = ".history.avro"
KEY_SUFFIX = ".node-key"
SHOWN = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class Checked:
    """One history replayed: what it folded to and how that compares with the recording."""

    history: Path
    outcome: Outcome
    comparison: Comparison
    recorded_fold_version: int | None

    def as_json(self) -> dict[str, Any]:
        first = self.comparison.first
        return {
            "history": str(self.history),
            "events": self.outcome.events,
            "jobs": len(self.outcome.jobs),
            "schedules": len(self.outcome.schedules),
            "undecodable": len(self.outcome.undecodable),
            "identical": self.comparison.identical,
            "first_divergence": None if first is None else first.as_json(),
            "diverged_entities": len(self.comparison.divergences),
            "recorded_fold_version": self.recorded_fold_version,
            "fold_version": FOLD_VERSION,
        }


def histories(paths: list[Path]) -> list[Path]:
    """The history files named, directories expanded to their ``*.history.avro`` files."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.glob(f"*{HISTORY_SUFFIX}"))
        elif path.is_file():
            found.append(path)
        else:
            raise OperatorError(ExitCode.NOT_FOUND, f"no such file or directory: {path}")
    if not found:
        raise OperatorError(
            ExitCode.NOT_FOUND, "no *.history.avro files in " + ", ".join(map(str, paths))
        )
    return found


def load_expected(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OperatorError(ExitCode.NOT_FOUND, f"no recorded outcome {path}") from None
    except ValueError as exc:
        raise OperatorError(ExitCode.UNAVAILABLE, f"{path} is not JSON: {exc}") from None
    if not isinstance(document, dict) or not str(document.get("format", "")).startswith(
        "evsched.replay/"
    ):
        raise OperatorError(ExitCode.UNAVAILABLE, f"{path} is not an evsched replay outcome")
    return document


def keyring_for(history: Path) -> NodeKeyring | None:
    """The node keys to check a history's proofs with (core.roles): ``EVSCHED_NODE_KEY``'s, or
    those of ``<name>.node-key`` beside it (a test recording's throwaway keys), or none."""
    beside = history.with_name(history.name.removesuffix(HISTORY_SUFFIX) + KEY_SUFFIX)
    env = node_keyring_from_env()
    if env is not None or not beside.is_file():
        return env
    return node_keyring_from_env({KEY_FILE_ENV: str(beside)})


def recording_keyring(history: Path) -> NodeKeyring | None:
    """The keys a recorded history's nodes proved with: its ``<name>.node-key`` when it has one
    (the recording's own, whatever keys this shell holds), else ``EVSCHED_NODE_KEY``'s."""
    beside = history.with_name(history.name.removesuffix(HISTORY_SUFFIX) + KEY_SUFFIX)
    if beside.is_file():
        return node_keyring_from_env({KEY_FILE_ENV: str(beside)})
    return node_keyring_from_env()


def check(history: Path, expected: Path | None = None) -> Checked:
    """Replay ``history`` and compare it with its recorded outcome."""
    recorded = load_expected(expected or expected_path(history))
    outcome = fold_history(read_history(history).events, keyring=keyring_for(history))
    return Checked(
        history=history,
        outcome=outcome,
        comparison=compare(recorded, outcome),
        recorded_fold_version=recorded.get("fold_version"),
    )


def update(history: Path, expected: Path | None = None) -> Path:
    """Rewrite the recorded outcome of ``history`` with the current fold's; its path."""
    target = expected or expected_path(history)
    file = read_history(history)
    description = file.metadata.get("description", "")
    if target.exists():
        description = load_expected(target).get("description", description)
    document = expected_document(
        fold_history(file.events, keyring=keyring_for(history)),
        history=history.name,
        description=description,
    )
    target.write_text(dump_expected(document), encoding="utf-8")
    return target


def check_archive(archive: Path, expected: Path, *, update_expected: bool) -> Checked | None:
    """Replay every record of an archive directory against ``expected`` (or rewrite it)."""
    outcome = fold_history(archive_history(archive), keyring=node_keyring_from_env())
    if update_expected:
        document = expected_document(outcome, history=archive.name, description="an archive")
        expected.write_text(dump_expected(document), encoding="utf-8")
        out.print(f"wrote {expected}")
        return None
    recorded = load_expected(expected)
    return Checked(
        history=archive,
        outcome=outcome,
        comparison=compare(recorded, outcome),
        recorded_fold_version=recorded.get("fold_version"),
    )


def _archive_only(files: list[Path] | None, expected: Path | None) -> Path:
    if files:
        raise typer.BadParameter("--archive replays the archive: name no files", param_hint="FILES")
    if expected is None:
        raise typer.BadParameter(
            "--archive needs the outcome to compare with", param_hint="--expected"
        )
    return expected


def replay(
    *,
    files: Annotated[
        list[Path] | None, typer.Argument(help="History files, or folders of them.")
    ] = None,
    archive: Annotated[
        Path | None,
        typer.Option(
            "--archive",
            help="Replay an archive directory (evsched archive --to) instead of history files; "
            "with --expected.",
        ),
    ] = None,
    expected: Annotated[
        Path | None,
        typer.Option("--expected", help="The recorded outcome (default: <name>.expected.json)."),
    ] = None,
    update_expected: Annotated[
        bool,
        typer.Option(
            "--update-expected",
            help="Rewrite the outcome with the current fold (after an intended change).",
        ),
    ] = False,
    decisions: Annotated[
        bool,
        typer.Option(
            "--decisions",
            help="Re-plan the nodes' decisions (leases, their order, expiries, purges, fires) "
            "at each recorded step and compare them with the recorded ones, with the planner "
            "settings of <name>.decisions.json (--expected with --archive).",
        ),
    ] = False,
    dispatch_timeout_ms: Annotated[
        int | None,
        typer.Option(
            "--dispatch-timeout-ms", min=1, help="With --decisions: the nodes' dispatch timeout."
        ),
    ] = None,
    prelease_ms: Annotated[
        int | None,
        typer.Option("--prelease-ms", min=0, help="With --decisions: the nodes' --prelease-ms."),
    ] = None,
    partition: Annotated[
        int | None,
        typer.Option(
            "--partition", min=0, help="With --decisions: replay this partition of the live log."
        ),
    ] = None,
    start: Annotated[
        int | None,
        typer.Option(
            "--from", min=0, help="With --partition: the first offset judged (folded from 0)."
        ),
    ] = None,
    end: Annotated[
        int | None,
        typer.Option("--to", min=0, help="With --partition: the last offset (inclusive)."),
    ] = None,
    lag_ms: Annotated[
        int | None,
        typer.Option(
            "--lag-ms",
            min=0,
            help="With --decisions: how long before a step a job's last event may still have "
            "been unknown to the node (default 1000).",
        ),
    ] = None,
    as_json: Json = False,
) -> None:
    """Fold recorded histories with the current code; report the first divergence.

    Exit 0 when every history folds to its recorded outcome, 1 when one diverges.
    """
    overrides = Overrides(
        dispatch_timeout_ms=dispatch_timeout_ms, prelease_ms=prelease_ms, lag_ms=lag_ms
    )
    selection = _live_selection(decisions, partition, start, end)
    if decisions:
        _replay_decisions(
            files,
            archive=archive,
            selection=selection,
            expected=expected,
            update_expected=update_expected,
            overrides=overrides,
            as_json=as_json,
        )
        return
    if overrides != Overrides():
        raise typer.BadParameter(
            "--dispatch-timeout-ms, --prelease-ms and --lag-ms go with --decisions",
            param_hint="--decisions",
        )
    try:
        if archive is not None:
            done = check_archive(
                archive, _archive_only(files, expected), update_expected=update_expected
            )
            checked = [] if done is None else [done]
        else:
            checked = _check_files(files or [], expected, update_expected)
    except OperatorError as exc:
        err.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(int(exc.code)) from None
    except (HistoryFileError, ArchiveError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(int(ExitCode.UNAVAILABLE)) from None
    _print(checked, as_json)
    if not all(c.comparison.identical for c in checked):
        raise typer.Exit(int(ExitCode.FAILED))


def _replay_decisions(
    files: list[Path] | None,
    *,
    archive: Path | None,
    selection: LogRange | None,
    expected: Path | None,
    update_expected: bool,
    overrides: Overrides,
    as_json: bool,
) -> None:
    sources = [bool(files), archive is not None, selection is not None]
    if sum(sources) != 1:
        raise typer.BadParameter(
            "name history files or folders, or --archive DIR, or --partition (--from/--to)",
            param_hint="FILES",
        )
    if selection is not None:
        live: list[Judged] = []
        guarded(lambda: live.append(judge_live(selection, expected, overrides)[0]))
        judged = live
    else:
        judged = _judge_files(files, archive, expected, overrides, update_expected)
    print_judged(judged, as_json)
    if not all(j.identical for j in judged):
        raise typer.Exit(int(ExitCode.FAILED))


def _live_selection(
    decisions: bool, partition: int | None, start: int | None, end: int | None
) -> LogRange | None:
    """The range of the live log ``--partition``/``--from``/``--to`` name, if they do."""
    selection = check_selection(None, partition, start, end)  # export's rules
    if partition is None:
        return None
    if not decisions:
        raise typer.BadParameter(
            "the live log is replayed with --decisions", param_hint="--partition"
        )
    return selection


def _judge_files(
    files: list[Path] | None,
    archive: Path | None,
    expected: Path | None,
    overrides: Overrides,
    update_expected: bool,
) -> list[Judged]:
    try:
        if archive is not None:
            return [judge_archive(archive, expected, overrides, update=update_expected)]
        return [
            judge_history(h, overrides, recording_keyring(h), update=update_expected)
            for h in histories(files or [])
        ]
    except OperatorError as exc:
        err.print(f"[red]error:[/red] {escape(exc.message)}")
        raise typer.Exit(int(exc.code)) from None
    except (HistoryFileError, ArchiveError) as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}")
        raise typer.Exit(int(ExitCode.UNAVAILABLE)) from None


def _check_files(files: list[Path], expected: Path | None, update_expected: bool) -> list[Checked]:
    if not files:
        raise typer.BadParameter("name history files or folders, or --archive", param_hint="FILES")
    found = histories(files)
    if expected is not None and len(found) != 1:
        raise typer.BadParameter(
            "--expected goes with exactly one history file", param_hint="--expected"
        )
    if update_expected:
        for file in found:
            out.print(f"wrote {update(file, expected)}")
        return []
    return [check(file, expected) for file in found]


def _print(checked: list[Checked], as_json: bool) -> None:
    if as_json:
        emit_json([c.as_json() for c in checked])
        return
    for c in checked:
        o = c.outcome
        head = (
            f"{c.history.name}: {o.events} events, {len(o.jobs)} jobs, "
            f"{len(o.schedules)} schedules, {len(o.undecodable)} undecodable"
        )
        first = c.comparison.first
        if first is None:
            out.print(f"{head}: [green]identical[/green]")
            continue
        out.print(f"{head}: [red]DIVERGED[/red]")
        out.print(f"  first divergence: {escape(first.describe())}")
        rest = c.comparison.divergences[1:SHOWN]
        for more in rest:
            out.print(f"  then: {escape(more.describe())}")
        hidden = len(c.comparison.divergences) - 1 - len(rest)
        if hidden > 0:
            out.print(f"  and {hidden} more entities differ")
        if c.recorded_fold_version != FOLD_VERSION:
            out.print(
                f"  (recorded with fold version {c.recorded_fold_version}, this is {FOLD_VERSION})"
            )
