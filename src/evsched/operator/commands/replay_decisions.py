"""``evsched replay --decisions``: re-plan a recorded history's decisions, report the first
divergence of each kind (``operator.decisions``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.markup import escape

from evsched.adapters.archive.history_file import LoggedEvent, read_history
from evsched.adapters.proofs import NodeKeyring, node_keyring_from_env
from evsched.operator.archive_history import archive_history
from evsched.operator.decision_corpus import (
    count_divergence,
    decisions_path,
    dump_declared,
    read_declared,
)
from evsched.operator.decisions import DecisionDiff, DecisionModel, Divergence, diff_history
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.export import LogRange, range_events
from evsched.operator.render import emit_json, out
from evsched.settings import Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class Overrides:
    """Planner settings given on the command line: they win over a decisions file's."""

    dispatch_timeout_ms: int | None = None
    prelease_ms: int | None = None
    lag_ms: int | None = None

    def apply(self, model: DecisionModel) -> DecisionModel:
        budgets = model.budgets
        if self.dispatch_timeout_ms is not None:
            budgets = replace(budgets, dispatch_timeout_ms=self.dispatch_timeout_ms)
        if self.prelease_ms is not None:
            budgets = replace(budgets, prelease_ms=self.prelease_ms)
        lag = model.lag_ms if self.lag_ms is None else self.lag_ms
        return DecisionModel(budgets=budgets, lag_ms=lag)


@dataclass(frozen=True, slots=True, kw_only=True)
class Judged:
    """One history's decisions replayed, and what differs from the recording."""

    history: Path
    diff: DecisionDiff
    divergences: list[Divergence]
    declared: Path | None

    @property
    def identical(self) -> bool:
        return not self.divergences

    def as_json(self) -> dict[str, Any]:
        return {
            "history": str(self.history),
            "decisions_file": None if self.declared is None else str(self.declared),
            "events": self.diff.events,
            "judged": self.diff.judged,
            "refused": self.diff.refused,
            "unjudged": self.diff.unjudged,
            "identical": self.identical,
            "diverged": self.diff.diverged,
            "divergences": [d.as_json() for d in self.divergences],
        }


def _model(declared_at: Path | None, overrides: Overrides) -> tuple[DecisionModel, Any]:
    if declared_at is None or not declared_at.is_file():
        return overrides.apply(DecisionModel()), None
    try:
        declared = read_declared(declared_at)
    except ValueError as exc:
        raise OperatorError(ExitCode.UNAVAILABLE, str(exc)) from None
    return overrides.apply(declared.model), declared.judged


def judge_history(
    history: Path, overrides: Overrides, keyring: NodeKeyring | None, *, update: bool = False
) -> Judged:
    """Replay ``history``'s decisions with its ``<name>.decisions.json`` model (or rewrite it)."""
    declared_at = decisions_path(history)
    model, judged = _model(declared_at, overrides)
    diff = diff_history(read_history(history).events, model, keyring=keyring)
    if update:
        declared_at.write_text(dump_declared(history.name, model, diff), encoding="utf-8")
        judged = diff.judged
    return _judged(history, diff, judged, declared_at if declared_at.is_file() else None)


def judge_archive(
    archive: Path, declared_at: Path | None, overrides: Overrides, *, update: bool = False
) -> Judged:
    """Replay an archive directory's decisions with the model of ``declared_at`` (or defaults);
    with ``update``, (re)write ``declared_at`` with that model and the counts judged."""
    if declared_at is not None and not declared_at.is_file() and not update:
        raise OperatorError(ExitCode.NOT_FOUND, f"no decisions file {declared_at}")
    model, judged = _model(declared_at, overrides)
    diff = diff_history(archive_history(archive), model, keyring=node_keyring_from_env())
    if update and declared_at is not None:
        declared_at.write_text(dump_declared(archive.name, model, diff), encoding="utf-8")
        judged = diff.judged
    return _judged(archive, diff, judged, declared_at)


def judge_live(
    selection: LogRange, declared_at: Path | None, overrides: Overrides
) -> tuple[Judged, int]:
    """Replay the decisions of ``selection`` of the live log, folded from its partition's first
    offset so each step is planned from the state folded so far; with the records judged."""
    if declared_at is not None and not declared_at.is_file():
        raise OperatorError(ExitCode.NOT_FOUND, f"no decisions file {declared_at}")
    model, judged = _model(declared_at, overrides)
    settings = Settings.from_env()
    folded = replace(selection, start=0)

    async def read() -> list[LoggedEvent]:
        return [event async for event in range_events(settings, folded)]

    try:
        events = asyncio.run(read())
    except ValueError as exc:  # a partition the log does not have
        raise OperatorError(ExitCode.USAGE, str(exc)) from None
    diff = diff_history(events, model, keyring=node_keyring_from_env(), judge_from=selection.start)
    shown = Path(f"{settings.namespace}.events p{selection.partition}")
    in_range = sum(1 for e in events if e.offset >= selection.start)
    return _judged(shown, diff, judged, declared_at), in_range


def _judged(
    history: Path, diff: DecisionDiff, judged: dict[str, int] | None, declared: Path | None
) -> Judged:
    found = diff.firsts()
    counted = count_divergence(judged, diff)
    if counted is not None:
        found.append(counted)
    return Judged(history=history, diff=diff, divergences=found, declared=declared)


def print_judged(judged: list[Judged], as_json: bool) -> None:
    if as_json:
        emit_json([j.as_json() for j in judged])
        return
    for j in judged:
        d = j.diff
        counts = ", ".join(f"{n} {kind}" for kind, n in d.judged.items())
        head = (
            f"{j.history.name}: {d.events} events; judged {counts}; {d.refused} refused by the "
            f"fold, {d.unjudged} permit steps not judged"
        )
        if j.declared is None:
            head += " (no decisions file: default planner settings)"
        if j.identical:
            out.print(f"{head}: [green]identical[/green]")
            continue
        out.print(f"{head}: [red]DIVERGED[/red]")
        for divergence in j.divergences:
            more = d.diverged.get(divergence.kind, 1) - 1
            tail = f" (and {more} more)" if more > 0 else ""
            out.print(f"  first {escape(divergence.describe())}{tail}")
