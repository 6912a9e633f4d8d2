"""``evsched api``: its options, and what it hands to uvicorn (no server is started here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi import FastAPI
from typer.testing import CliRunner

from evsched.api.context import ApiContext
from evsched.cli.api import api_command
from evsched.runtime.replica import Replica

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read docker-compose.yml")
COMPOSE = Path(__file__).resolve().parents[3] / "docker-compose.yml"


def cli() -> typer.Typer:
    """A CLI with the command registered the way evsched.cli registers it."""
    app = typer.Typer()
    app.command("api")(api_command)
    app.command("other")(lambda: None)  # two commands, so "api" is a subcommand as in evsched
    return app


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def run(app: FastAPI, **options: Any) -> None:
        seen["app"], seen["options"] = app, options

    monkeypatch.setattr("evsched.cli.api.uvicorn.run", run)
    # The real setup would bind structlog, for the whole session, to CliRunner's stderr.
    monkeypatch.setattr(
        "evsched.cli.api.configure_logging", lambda **kw: seen.setdefault("logging", kw)
    )
    return seen


def test_the_compose_service_is_a_valid_call() -> None:
    command = yaml.safe_load(COMPOSE.read_text())["services"]["api"]["command"]
    result = CliRunner().invoke(cli(), [*command, "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--host", "--port", "--data-dir", "--token-file", "--no-auth", "--app"):
        assert option in result.output


def test_options_reach_uvicorn_and_the_app(served: dict[str, Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(),
        ["api", "--port", "9999", "--data-dir", str(tmp_path), "--log-console"],
        env={"EVSCHED_API_TOKEN": "from-env-write-token", "EVSCHED_NAMESPACE": "cmdtest"},
    )
    assert result.exit_code == 0, result.output
    assert served["options"]["host"] == "127.0.0.1"
    assert served["options"]["port"] == 9999
    assert served["logging"] == {"json": False}
    ctx = served["app"].state.evsched
    assert isinstance(ctx, ApiContext)
    assert ctx.tokens.write == "from-env-write-token"
    assert ctx.settings.namespace == "cmdtest"
    assert isinstance(ctx.replica, Replica)
    assert ctx.replica.data_dir == tmp_path
    assert ctx.replica.on_commit == ctx.metrics.observe_commit


def test_an_app_reference_lends_its_tasks(served: dict[str, Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(), ["api", "--data-dir", str(tmp_path), "--app", "examples.app:app", "--no-auth"]
    )
    assert result.exit_code == 0, result.output
    assert "example.noop" in served["app"].state.evsched.client.tasks
    bad = CliRunner().invoke(cli(), ["api", "--app", "examples.app:nothing", "--no-auth"])
    assert bad.exit_code != 0


# --- authentication settings (issue 9, D.11) ----------------------------------------------------


@pytest.mark.parametrize("env", [{}, {"EVSCHED_API_TOKEN": ""}, {"EVSCHED_API_TOKEN": "  "}])
def test_no_or_an_empty_token_refuses_to_start(
    served: dict[str, Any], tmp_path: Path, env: dict[str, str]
) -> None:
    result = CliRunner().invoke(cli(), ["api", "--data-dir", str(tmp_path)], env=env)
    assert result.exit_code == 2
    assert "no write token" in result.output
    assert "--no-auth" in result.output
    assert "app" not in served


def test_no_auth_must_be_asked_for_and_then_serves_open(
    served: dict[str, Any], tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        cli(), ["api", "--data-dir", str(tmp_path), "--no-auth"], env={"EVSCHED_API_TOKEN": ""}
    )
    assert result.exit_code == 0, result.output
    tokens = served["app"].state.evsched.tokens
    assert tokens.write is None
    assert not tokens.guard_reads


def test_no_auth_with_a_token_is_a_contradiction(served: dict[str, Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(), ["api", "--data-dir", str(tmp_path), "--no-auth"], env={"EVSCHED_API_TOKEN": "x"}
    )
    assert result.exit_code == 2
    assert "contradicts" in result.output


def test_tokens_come_from_files_and_reads_can_be_guarded(
    served: dict[str, Any], tmp_path: Path
) -> None:
    (tmp_path / "w").write_text("write-secret-from-a-file\n")
    (tmp_path / "r").write_text("read-secret-from-a-file\n")
    args = ["api", "--data-dir", str(tmp_path / "d"), "--token-file", str(tmp_path / "w")]
    result = CliRunner().invoke(
        cli(), [*args, "--read-token-file", str(tmp_path / "r")], env={"EVSCHED_API_TOKEN": ""}
    )
    assert result.exit_code == 0, result.output
    tokens = served["app"].state.evsched.tokens
    assert (tokens.write, tokens.read, tokens.guard_reads) == (
        "write-secret-from-a-file",
        "read-secret-from-a-file",
        True,
    )
    assert "secret" not in repr(tokens)
    assert "secret" not in repr(served["app"].state.evsched)


def test_an_empty_token_file_refuses_to_start(served: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "w").write_text("\n")
    result = CliRunner().invoke(
        cli(), ["api", "--data-dir", str(tmp_path), "--token-file", str(tmp_path / "w")]
    )
    assert result.exit_code == 2
    assert "is empty" in result.output


def test_no_option_takes_a_secret_value() -> None:
    """A token on the command line shows in ``ps``: there is no option to pass one."""
    result = CliRunner().invoke(cli(), ["api", "--help"])
    assert "--token " not in result.output
    refused = CliRunner().invoke(cli(), ["api", "--token", "x"])
    assert refused.exit_code == 2


def test_the_real_process_refuses_to_start_with_an_empty_token(tmp_path: Path) -> None:
    """``EVSCHED_API_TOKEN=`` (as a compose file passes an unset variable) must not serve open."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVSCHED_API_")}
    env["EVSCHED_API_TOKEN"] = ""
    done = subprocess.run(
        [sys.executable, "-m", "evsched", "api", "--data-dir", str(tmp_path), "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: no write token: set EVSCHED_API_TOKEN (or --token-file, a file holding it), "
        "or pass --no-auth to serve without authentication"
    ]
