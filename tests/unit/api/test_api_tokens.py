"""Weak tokens stop ``evsched api`` at start (issue 32): too short, or a read token that is the
write token (which would let a reader write)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from evsched.api import auth
from evsched.api.auth import AuthConfigError, Tokens, load_tokens
from tests.unit.api.test_api_command import cli, served  # noqa: F401 (the fixture)

MIN_TOKEN_CHARS = 16  # the documented minimum
OPERATOR_DOC = Path(__file__).resolve().parents[3] / "docs/operator.md"
WRITE = "w" * MIN_TOKEN_CHARS
READ = "r" * MIN_TOKEN_CHARS


def test_the_minimum_is_documented_and_sane() -> None:
    assert auth.MIN_TOKEN_CHARS == MIN_TOKEN_CHARS
    assert f"at least {MIN_TOKEN_CHARS} characters" in OPERATOR_DOC.read_text()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"EVSCHED_API_TOKEN": "x"}, "EVSCHED_API_TOKEN"),
        ({"EVSCHED_API_TOKEN": "w" * (MIN_TOKEN_CHARS - 1)}, "EVSCHED_API_TOKEN"),
        ({"EVSCHED_API_TOKEN": WRITE, "EVSCHED_API_READ_TOKEN": "r"}, "EVSCHED_API_READ_TOKEN"),
    ],
)
def test_a_short_token_is_refused_naming_its_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(AuthConfigError, match=f"{named}.*at least {MIN_TOKEN_CHARS}"):
        load_tokens(env)


def test_a_short_token_file_is_refused_naming_the_option(tmp_path: Path) -> None:
    (tmp_path / "w").write_text("short\n")
    with pytest.raises(AuthConfigError, match=re.escape(f"--token-file {tmp_path / 'w'} has 5")):
        load_tokens({}, token_file=tmp_path / "w")
    (tmp_path / "r").write_text("short\n")
    with pytest.raises(AuthConfigError, match=r"--read-token-file .*at least 16"):
        load_tokens({"EVSCHED_API_TOKEN": WRITE}, read_token_file=tmp_path / "r")


def test_a_read_token_equal_to_the_write_token_is_refused(tmp_path: Path) -> None:
    env = {"EVSCHED_API_TOKEN": WRITE, "EVSCHED_API_READ_TOKEN": WRITE}
    with pytest.raises(AuthConfigError, match=r"EVSCHED_API_READ_TOKEN.*EVSCHED_API_TOKEN"):
        load_tokens(env)
    (tmp_path / "r").write_text(f"{WRITE}\n")
    with pytest.raises(AuthConfigError, match=r"--read-token-file .*EVSCHED_API_TOKEN"):
        load_tokens({"EVSCHED_API_TOKEN": WRITE}, read_token_file=tmp_path / "r")


def test_tokens_made_in_code_are_held_to_the_same_rules() -> None:
    with pytest.raises(AuthConfigError, match="at least 16"):
        Tokens(write="t")
    with pytest.raises(AuthConfigError, match="at least 16"):
        Tokens(write=WRITE, read="r")
    with pytest.raises(AuthConfigError, match="differ"):
        Tokens(write=WRITE, read=WRITE)
    assert Tokens(write=WRITE, read=READ).guard_reads


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"EVSCHED_API_TOKEN": "x"}, "EVSCHED_API_TOKEN"),
        ({"EVSCHED_API_TOKEN": WRITE, "EVSCHED_API_READ_TOKEN": WRITE}, "EVSCHED_API_READ_TOKEN"),
    ],
)
def test_evsched_api_refuses_to_start_with_a_weak_token(
    served: dict[str, Any],  # noqa: F811 (the fixture)
    tmp_path: Path,
    env: dict[str, str],
    named: str,
) -> None:
    result = CliRunner().invoke(cli(), ["api", "--data-dir", str(tmp_path)], env=env)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and named in result.output
    assert WRITE not in result.output  # never the token itself
    assert "app" not in served
