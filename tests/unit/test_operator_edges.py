"""Operator commands over hostile log contents (issue 9, E.15, E.17, A.1): undecodable records
are listed, a job nested deeper than anything renders, and errors are one line, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from evsched.operator import register
from tests.unit.test_operator_audit import Story, enq

runner = CliRunner()
GARBAGE = b"\xc3\x01not avro at all"


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def replica_dir(tmp_path: Path) -> Path:
    """A one-partition replica: a job nested 5,000 deep, two undecodable records, a plain job."""
    story = Story()
    story.add(enq("deep", args=('{"args":' + nested(5_000) + ',"kwargs":{}}').encode()))
    story.add(GARBAGE)
    story.add(enq("plain"))
    story.add(b"")
    story.index(tmp_path / "replica" / "p0000").close()
    return tmp_path / "replica"


def test_undecodable_records_are_listed_with_offset_size_and_reason(
    cli: typer.Typer, replica_dir: Path
) -> None:
    args = ["undecodable", "--offline", "--data-dir", str(replica_dir)]
    result = runner.invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["partition"], r["offset"], r["size"]) for r in rows] == [
        (0, 1, len(GARBAGE)),
        (0, 3, 0),
    ]
    assert all(r["reason"] for r in rows)
    text = runner.invoke(cli, [*args, "--limit", "1"], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert "1 undecodable record(s)" in text.output
    other = runner.invoke(cli, [*args, "--partition", "3", "--json"])
    assert json.loads(other.output) == []


def test_a_job_nested_deeper_than_anything_renders(cli: typer.Typer, replica_dir: Path) -> None:
    for extra in ([], ["--json"]):
        result = runner.invoke(
            cli, ["job", "deep", "--offline", "--data-dir", str(replica_dir), *extra]
        )
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
    listed = runner.invoke(cli, ["jobs", "--offline", "--data-dir", str(replica_dir), "--json"])
    assert listed.exit_code == 0, listed.output
    assert {j["job_id"] for j in json.loads(listed.output)} == {"deep", "plain"}


@pytest.mark.parametrize("depth", [65, 100_000])
def test_enqueue_args_nested_too_deep_are_a_usage_error(cli: typer.Typer, depth: int) -> None:
    result = runner.invoke(cli, ["enqueue", "t", nested(depth)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
