"""Compares a replayed outcome with the recorded one and names the first divergence in log order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evsched.operator.readings import iso
from evsched.operator.replay import (
    CONTROL_COLUMNS,
    CONTROL_FINAL,
    JOB_COLUMNS,
    JOB_FINAL,
    LIMIT_COLUMNS,
    LIMIT_FINAL,
    SCHEDULE_COLUMNS,
    SCHEDULE_FINAL,
    Outcome,
    violation_row,
)

_TIMES = frozenset({"run_at", "lease_until", "next_fire_at", "last_fire_at"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Divergence:
    """Where the current fold first disagrees with the recording, and on what."""

    entity_id: str
    partition: int
    offset: int
    kind: str
    field: str
    expected: Any
    actual: Any

    def describe(self) -> str:
        return (
            f"{self.entity_id} at p{self.partition}@{self.offset} ({self.kind}): {self.field} "
            f"expected {_show(self.field, self.expected)}, got {_show(self.field, self.actual)}"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.entity_id,
            "partition": self.partition,
            "offset": self.offset,
            "kind": self.kind,
            "field": self.field,
            "expected": self.expected,
            "actual": self.actual,
        }


def _show(name: str, value: Any) -> str:
    if name.removeprefix("final ") in _TIMES and isinstance(value, int):
        return f"{value} ({iso(value)})"
    return repr(value) if isinstance(value, str) else str(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Every entity that differs, ordered by where it first does; empty when identical."""

    divergences: tuple[Divergence, ...]

    @property
    def identical(self) -> bool:
        return not self.divergences

    @property
    def first(self) -> Divergence | None:
        return self.divergences[0] if self.divergences else None


def compare(expected: dict[str, Any], actual: Outcome) -> Comparison:
    """The divergences of ``actual`` from ``expected``, first (in log order) first."""
    found: list[Divergence] = []
    finals = actual.finals()
    for section, rows, columns, final_fields in (
        ("jobs", actual.jobs, JOB_COLUMNS, JOB_FINAL),
        ("schedules", actual.schedules, SCHEDULE_COLUMNS, SCHEDULE_FINAL),
        ("controls", actual.controls, CONTROL_COLUMNS, CONTROL_FINAL),
        ("limits", actual.limits, LIMIT_COLUMNS, LIMIT_FINAL),
    ):
        recorded: dict[str, Any] = expected.get(section, {})
        for key in sorted(set(recorded) | set(rows)):
            diverged = _entity(key, recorded.get(key), rows.get(key), columns)
            if diverged is None and key in recorded:
                diverged = _final(key, recorded[key], rows[key], finals.get(key), final_fields)
            if diverged is not None:
                found.append(diverged)
    found += _undecodable(expected.get("undecodable", []), actual.undecodable)
    found += _violations(expected.get("violations", []), actual)
    found.sort(key=lambda d: (d.partition, d.offset))
    return Comparison(divergences=tuple(found))


def _entity(
    key: str,
    recorded: dict[str, Any] | None,
    rows: list[list[Any]] | None,
    columns: Sequence[str],
) -> Divergence | None:
    """The first row of ``key`` that differs from the recording, if any."""
    if recorded is None or rows is None:
        present = rows or (recorded or {}).get("events") or [[-1, -1, "?"]]
        first = present[0]
        return Divergence(
            entity_id=key,
            partition=first[0],
            offset=first[1],
            kind=str(first[2]),
            field="entity",
            expected="recorded" if recorded is not None else "absent",
            actual="folded" if rows is not None else "absent",
        )
    want: list[list[Any]] = recorded["events"]
    for old, new in zip(want, rows, strict=False):
        for name, before, after in zip(columns, old, new, strict=True):
            if before != after:
                return _at(key, new, name, before, after)
    if len(want) != len(rows):
        tail = (want if len(want) > len(rows) else rows)[min(len(want), len(rows))]
        return _at(key, tail, "events", len(want), len(rows))
    return None


def _final(
    key: str,
    recorded: dict[str, Any],
    rows: list[list[Any]],
    final: dict[str, Any] | None,
    names: Sequence[str],
) -> Divergence | None:
    """A final field that differs although every row matched (e.g. a result or an error)."""
    want = recorded.get("final") or {}
    have = final or {}
    for name in names:
        if want.get(name) != have.get(name):
            label = "final state (encoded)" if name == "sha256" else f"final {name}"
            return _at(key, rows[-1], label, want.get(name), have.get(name))
    return None


def _at(key: str, row: list[Any], name: str, expected: Any, actual: Any) -> Divergence:
    return Divergence(
        entity_id=key,
        partition=row[0],
        offset=row[1],
        kind=str(row[2]),
        field=name,
        expected=expected,
        actual=actual,
    )


def _undecodable(recorded: list[list[int]], actual: list[list[int]]) -> list[Divergence]:
    was, now = {tuple(p) for p in recorded}, {tuple(p) for p in actual}
    return [
        Divergence(
            entity_id="(undecodable)",
            partition=p,
            offset=o,
            kind="undecodable" if (p, o) in was else "?",
            field="verdict",
            expected="undecodable" if (p, o) in was else "decodes",
            actual="undecodable" if (p, o) in now else "decodes",
        )
        for p, o in sorted(was ^ now)
    ]


def _violations(recorded: list[list[Any]], actual: Outcome) -> list[Divergence]:
    known = {tuple(v) for v in recorded}
    return [
        Divergence(
            entity_id=v.job_id,
            partition=v.partition,
            offset=v.offset,
            kind="invariant",
            field=v.invariant,
            expected="no violation",
            actual=v.detail,
        )
        for v in actual.violations
        if tuple(violation_row(v)) not in known
    ]
