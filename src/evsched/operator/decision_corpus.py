"""The decisions a recorded history is expected to replay to: ``<name>.decisions.json``.

It declares what the recording's nodes ran with (their planner budgets, ``DecisionModel``) and how
many decisions of each kind the replay judges, so a history that stops being judged (a walk that
skips it) shows up as well as a planner that decides otherwise. ``evsched replay --decisions``
reads it; ``--update-expected`` rewrites the counts and keeps the declared model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evsched.core.planner import PlannerBudgets
from evsched.operator.decisions import DEFAULT_LAG_MS, DecisionDiff, DecisionModel, Divergence

FORMAT = "evsched.decisions/1"
SUFFIX = ".decisions.json"
COUNTED = "judged"


def decisions_path(history: Path) -> Path:
    """``<name>.decisions.json`` next to ``<name>.history.avro``."""
    name = history.name.removesuffix(".avro").removesuffix(".history")
    return history.with_name(f"{name}{SUFFIX}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Declared:
    """A decisions file: the model the history replays with, and the judged counts recorded."""

    model: DecisionModel
    judged: dict[str, int] | None


def model_document(model: DecisionModel) -> dict[str, Any]:
    budgets = model.budgets
    return {
        "dispatch_timeout_ms": budgets.dispatch_timeout_ms,
        "prelease_ms": budgets.prelease_ms,
        "lag_ms": model.lag_ms,
    }


def model_of(document: dict[str, Any], where: str) -> DecisionModel:
    """The model a decisions document declares; ``ValueError`` naming the field if it is bad."""
    planner = document.get("planner", {})
    if not isinstance(planner, dict):
        raise ValueError(f"{where}: 'planner' must be an object")
    values: dict[str, int] = {}
    defaults = PlannerBudgets()
    for name, default in (
        ("dispatch_timeout_ms", defaults.dispatch_timeout_ms),
        ("prelease_ms", defaults.prelease_ms),
        ("lag_ms", DEFAULT_LAG_MS),
    ):
        value = planner.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}: planner.{name} must be an integer >= 0, got {value!r}")
        values[name] = value
    budgets = PlannerBudgets(
        dispatch_timeout_ms=values["dispatch_timeout_ms"], prelease_ms=values["prelease_ms"]
    )
    return DecisionModel(budgets=budgets, lag_ms=values["lag_ms"])


def read_declared(path: Path) -> Declared:
    """The decisions file at ``path``; ``ValueError`` when it is not one."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise ValueError(f"{path} is not an evsched decisions file ({FORMAT})")
    judged = document.get(COUNTED)
    return Declared(
        model=model_of(document, str(path)), judged=judged if isinstance(judged, dict) else None
    )


def dump_declared(history: str, model: DecisionModel, diff: DecisionDiff) -> str:
    """The decisions file of ``history`` as replayed with ``model``: deterministic JSON."""
    document = {
        "format": FORMAT,
        "history": history,
        "planner": model_document(model),
        COUNTED: diff.judged,
        "refused": diff.refused,
        "unjudged": diff.unjudged,
    }
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def count_divergence(recorded: dict[str, int] | None, diff: DecisionDiff) -> Divergence | None:
    """A divergence when the replay judged other numbers of decisions than were recorded."""
    if recorded is None or recorded == diff.judged:
        return None
    kinds = sorted(set(recorded) | set(diff.judged))
    changed = [k for k in kinds if recorded.get(k) != diff.judged.get(k)]
    return Divergence(
        kind="count",
        entity=", ".join(changed),
        partition=-1,
        offset=-1,
        recorded=", ".join(f"{k} {recorded.get(k)}" for k in changed),
        planned=", ".join(f"{k} {diff.judged.get(k)}" for k in changed),
        why="the replay judged another number of decisions than the recording declares",
    )
