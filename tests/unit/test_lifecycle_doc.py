"""docs/job-lifecycle.md stays in step with the Status and Verdict enums, event kinds and fold."""

from __future__ import annotations

import re
from pathlib import Path

from evsched.core.events import EVENT_TYPES, JOB_EVENT_TYPES
from evsched.core.state import Status, Verdict
from tests.unit.test_fold_table import TABLE

DOC = Path(__file__).resolve().parents[2] / "docs" / "job-lifecycle.md"
TEXT = DOC.read_text(encoding="utf-8")
EDGE = re.compile(r"^\s*(\[\*\]|\w+) --> (\[\*\]|\w+)(?::\s*(\w+))?", re.MULTILINE)


def _diagram() -> str:
    match = re.search(r"```mermaid\n(stateDiagram-v2\n.*?)```", TEXT, re.DOTALL)
    assert match, "the page has a mermaid stateDiagram-v2 block"
    return match.group(1)


def _edges() -> set[tuple[str, str, str | None]]:
    return {(a, b, kind) for a, b, kind in EDGE.findall(_diagram())}


def test_every_status_verdict_and_event_kind_is_documented() -> None:
    for name in [*Status, *Verdict]:
        assert f"`{name}`" in TEXT, name
    for kind in EVENT_TYPES:
        assert f"`{kind.__name__}`" in TEXT, kind.__name__


def test_every_verdict_has_a_row_in_the_verdict_table() -> None:
    rows = set(re.findall(r"^\| `(\w+)` \|", TEXT, re.MULTILINE))
    assert {verdict.value for verdict in Verdict} <= rows
    assert {status.value for status in Status} <= rows


def test_the_diagram_has_every_status_and_only_real_statuses_and_kinds() -> None:
    edges = _edges()
    states = {a for a, _, _ in edges} | {b for _, b, _ in edges}
    assert states == {"[*]", *Status}
    kinds = {kind for _, _, kind in edges if kind}
    assert kinds == {kind.__name__ for kind in JOB_EVENT_TYPES}


def test_every_applied_transition_of_the_fold_table_is_drawn() -> None:
    drawn = {(a, b, kind) for a, b, kind in _edges()}
    for (before, kind, _variant), (verdict, after) in TABLE.items():
        if verdict is not Verdict.APPLIED:
            continue
        source = "[*]" if before is None else before.value
        assert after is not None
        assert (source, after.value, kind) in drawn, (source, after.value, kind)
