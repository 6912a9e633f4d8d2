"""``evsched queues limit``: its arguments are checked before anything is written, and a bad one
says what is wrong."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from evsched.cli import app
from evsched.operator.commands.queues import parse_rate


@pytest.mark.parametrize(
    ("text", "rate"),
    [("100/60s", (100, 60_000)), ("5/1", (5, 1_000)), ("10/500ms", (10, 500)),
     ("600/1h", (600, 3_600_000)), ("3/2m", (3, 120_000))],
)  # fmt: skip
def test_a_rate_reads_as_starts_per_window(text: str, rate: tuple[int, int]) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["100", "x/1s", "5/1d", "5/s", "-1/1s"])
def test_a_bad_rate_says_what_is_expected(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="expected N/<window>"):
        parse_rate(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["q"], "give --max-running N"),
        (["q", "--max-running", "2", "--remove"], "give --max-running N"),
        (["q", "--max-running", "0"], "max_running 0 is outside"),
        (["bad queue!", "--max-running", "1"], "must be non-empty and only"),
        (["q", "--rate", "0/1s"], "rate_starts 0 is outside"),
    ],
)
def test_bad_arguments_are_refused_before_writing(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["queues", "limit", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
