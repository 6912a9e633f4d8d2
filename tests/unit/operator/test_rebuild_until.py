"""``evsched rebuild --until``: text naming no point of the log, or --until with --verify, is a
usage error naming --until before anything is read (no broker: the address is unreachable)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from evsched.operator import register


def _run(*args: str) -> tuple[int, str]:
    app = typer.Typer()
    register(app)
    env = {"EVSCHED_KAFKA_BOOTSTRAP": "127.0.0.1:1", "COLUMNS": "200"}
    result = CliRunner().invoke(app, ["rebuild", *args], env=env)
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("until", "says"),
    [
        ("last tuesday", "neither an RFC 3339 time"),
        ("2026-12-07T14:02:00", "no time zone"),
        ("0:1,0:2", "named twice"),
        ("-7", "out of range"),
    ],
)
def test_text_naming_no_point_is_a_usage_error(tmp_path: Path, until: str, says: str) -> None:
    code, output = _run("--until", until, "--data-dir", str(tmp_path / "r"))
    assert code == 2, output
    assert "--until" in output and says in output
    assert not (tmp_path / "r").exists()


def test_until_and_verify_do_not_go_together(tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    code, output = _run(
        "--until", "5", "--verify", "--live-dir", str(live), "--data-dir", str(tmp_path / "r")
    )
    assert code == 2, output
    assert "--until" in output and "leave out --until" in output
