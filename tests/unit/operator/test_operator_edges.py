"""Operator commands over hostile log contents (issue 9, E.15, E.17, A.1): undecodable records
are listed, a job nested deeper than anything renders, and errors are one line, not a traceback."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from evsched.operator import render
from tests.unit.operator.test_operator_audit import Story, enq

runner = CliRunner()
GARBAGE = b"\xc3\x01not avro at all"


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables at the width these tests read them: the console takes COLUMNS when it is made,
    at import, which is another test's moment in a pytest-xdist worker."""
    monkeypatch.setattr(render.out, "width", 200)


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


@pytest.mark.parametrize(
    "failure", [struct.error("'H' format requires 0 <= number <= 65535"), RecursionError()]
)
def test_an_internal_failure_is_one_line_not_a_traceback(
    cli: typer.Typer, replica_dir: Path, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise failure

    monkeypatch.setattr("evsched.operator.commands.jobs.find_jobs", broken)
    monkeypatch.delenv("EVSCHED_DEBUG", raising=False)
    result = runner.invoke(cli, ["jobs", "--offline", "--data-dir", str(replica_dir)])
    assert result.exit_code == 70
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: internal error (")
    assert type(failure).__qualname__ in lines[0]
    monkeypatch.setenv("EVSCHED_DEBUG", "1")
    debug = runner.invoke(cli, ["jobs", "--offline", "--data-dir", str(replica_dir)])
    assert isinstance(debug.exception, type(failure))


def test_an_interrupted_command_exits_130(
    cli: typer.Typer, replica_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("evsched.operator.commands.jobs.find_jobs", interrupted)
    result = runner.invoke(cli, ["jobs", "--offline", "--data-dir", str(replica_dir)])
    assert result.exit_code == 130
    assert result.output.strip() == "interrupted"


@pytest.mark.parametrize(
    ("variable", "value"),
    [("EVSCHED_EVENT_PARTITIONS", "six"), ("EVSCHED_KAFKA_SSL_CAFILE", "/nonexistent/ca.pem")],
)
@pytest.mark.parametrize(
    "args", [["jobs"], ["rebuild", "--data-dir", "{tmp}/r"], ["enqueue", "t", "--no-wait"]]
)
def test_a_bad_setting_is_one_line_naming_the_variable(
    cli: typer.Typer, tmp_path: Path, variable: str, value: str, args: list[str]
) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = runner.invoke(cli, argv, env={variable: value, "COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert variable in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
