"""``evsched workflow`` offline, from a one-partition index: the graph as a table and as JSON,
an unknown job, and the audit of a child naming the parent's record that released it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from evsched.core import events as ev
from evsched.core.workflow.graph import GraphNode, ParentLink
from evsched.operator import render
from evsched.operator.audit import audit
from evsched.operator.workflow_render import parents_text
from tests.unit.operator.test_operator_audit import Story, enq, fail, lease, ok, start

runner = CliRunner()


def _resolved(child: str, parent: str, outcome: str, offset: int) -> ev.ParentResolved:
    return ev.ParentResolved(
        event_id=f"r-{child}", job_id=child, emitted_at=0, source="node-1", parent_id=parent,
        outcome=outcome, parent_partition=0, parent_offset=offset,
        result=b"1" if outcome == "succeeded" else None,
    )  # fmt: skip


def _registered(parent: str, child: str) -> ev.ChildRegistered:
    return ev.ChildRegistered(
        event_id=f"c-{child}", job_id=parent, emitted_at=0, source="client", child_id=child
    )


def chain_story() -> Story:
    """a -> b -> c -> d: a succeeds and releases b, b dies, c gives up, d still waits."""
    story = Story()
    story.add(enq("a"))
    for parent, child in (("a", "b"), ("b", "c"), ("c", "d")):
        story.add(enq(child, after=(parent,)))
        story.add(_registered(parent, child))
    story.add(lease("a", 1, 1))
    story.add(start("a", 1))
    a_end = story.add(ok("a", 1))
    story.add(_resolved("b", "a", "succeeded", a_end))
    story.add(lease("b", 1, 1))
    story.add(start("b", 1))
    b_end = story.add(fail("b", 1, retryable=False))
    story.add(_resolved("c", "b", "dead", b_end))
    return story


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    chain_story().index(tmp_path / "replica" / "p0000").close()
    yield tmp_path / "replica"


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables at the width these tests read them: the console takes COLUMNS when it is made,
    at import, which is another test's moment in a pytest-xdist worker."""
    monkeypatch.setattr(render.out, "width", 250)


def invoke(cli: typer.Typer, *args: str) -> tuple[int, str]:
    result = runner.invoke(cli, list(args), env={"COLUMNS": "250"})
    return result.exit_code, result.output


def test_workflow_id_shows_the_graph_parents_first(cli: typer.Typer, data_dir: Path) -> None:
    code, output = invoke(cli, "workflow", "c", "--offline", "--data-dir", str(data_dir))
    assert code == 0, output
    assert "workflow of c: 4 jobs (1 cancelled, 1 dead, 1 succeeded, 1 waiting)" in output
    rows = [line for line in output.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == ["a", "b", "c *", "d"]
    assert "released by p0@9 (a succeeded)" in rows[1]
    assert "cancelled by p0@13 (b dead)" in rows[2]
    assert "not resolved by c" not in rows[3] and "waiting on c" in rows[3]


def test_workflow_show_json_is_the_api_document(cli: typer.Typer, data_dir: Path) -> None:
    args = ["workflow", "show", "b", "--offline", "--data-dir", str(data_dir), "--json"]
    code, output = invoke(cli, *args)
    assert code == 0, output
    document: dict[str, Any] = json.loads(output)
    assert (document["root"], document["truncated"], document["node_limit"]) == ("b", False, 2000)
    assert document["counts"] == {"cancelled": 1, "dead": 1, "succeeded": 1, "waiting": 1}
    b = document["nodes"][1]
    assert b["decided_by"] == {"id": "a", "outcome": "succeeded", "partition": 0, "offset": 9}
    assert b["decision"] == "released" and b["children"] == ["c"] and b["attempt"] == 1
    code, output = invoke(cli, *args, "--limit", "2")
    assert json.loads(output)["truncated"] is True


def test_an_unknown_job_is_one_line_and_exit_3(cli: typer.Typer, data_dir: Path) -> None:
    code, output = invoke(cli, "workflow", "nope", "--offline", "--data-dir", str(data_dir))
    assert code == 3
    assert output.strip() == "error: no job 'nope' in the replica"
    code, output = invoke(cli, "workflow", "--offline", "--data-dir", str(data_dir), "")
    assert code == 3 and output.count("\n") == 1


def test_workflow_alone_shows_its_help(cli: typer.Typer) -> None:
    code, output = invoke(cli, "workflow")
    assert "show" in output and "cancel" in output and "requeue" in output
    code, output = invoke(cli, "workflow", "requeue", "--help")
    assert code == 0 and "--dry-run" in output


def test_the_audit_of_a_child_names_the_parents_record_that_released_it(tmp_path: Path) -> None:
    index = chain_story().index(tmp_path / "p0000")
    found = audit(index, "b")
    index.close()
    assert found is not None
    [row] = [r for r in found.rows if r.entry.kind == "ParentResolved"]
    assert row.reading == (
        "parent a succeeded (its record at p0@9, sent by node-1): released by it, rule "
        "all_succeeded met"
    )


def test_parents_text_of_a_job_cancelled_before_its_parents_ended() -> None:
    node = GraphNode(
        id="x", found=True, status="cancelled", parents=(ParentLink(id="p"), ParentLink(
            id="q", outcome="succeeded", partition=0, offset=3)),
    )  # fmt: skip
    assert parents_text(node) == "not resolved by p (1 of 2 resolved)"
    assert parents_text(GraphNode(id="r", found=True, status="scheduled")) == ""
