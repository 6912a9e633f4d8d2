"""``evsched api``: its options, and what it hands to uvicorn (no server is started here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from fastapi import FastAPI
from typer.testing import CliRunner

from evsched.api import api_command
from evsched.api.context import ApiContext
from evsched.runtime.replica import Replica

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read docker-compose.yml")
COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


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

    monkeypatch.setattr("evsched.api.command.uvicorn.run", run)
    # The real setup would bind structlog, for the whole session, to CliRunner's stderr.
    monkeypatch.setattr(
        "evsched.api.command.configure_logging", lambda **kw: seen.setdefault("logging", kw)
    )
    return seen


def test_the_compose_service_is_a_valid_call() -> None:
    command = yaml.safe_load(COMPOSE.read_text())["services"]["api"]["command"]
    result = CliRunner().invoke(cli(), [*command, "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--host", "--port", "--data-dir", "--token", "--app"):
        assert option in result.output


def test_options_reach_uvicorn_and_the_app(served: dict[str, Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(),
        ["api", "--port", "9999", "--data-dir", str(tmp_path), "--log-console"],
        env={"EVSCHED_API_TOKEN": "from-env", "EVSCHED_NAMESPACE": "cmdtest"},
    )
    assert result.exit_code == 0, result.output
    assert served["options"]["host"] == "127.0.0.1"
    assert served["options"]["port"] == 9999
    assert served["logging"] == {"json": False}
    ctx = served["app"].state.evsched
    assert isinstance(ctx, ApiContext)
    assert ctx.token == "from-env"
    assert ctx.settings.namespace == "cmdtest"
    assert isinstance(ctx.replica, Replica)
    assert ctx.replica.data_dir == tmp_path
    assert ctx.replica.on_commit == ctx.metrics.observe_commit


def test_an_app_reference_lends_its_tasks(served: dict[str, Any], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli(), ["api", "--data-dir", str(tmp_path), "--app", "examples.app:app"]
    )
    assert result.exit_code == 0, result.output
    assert "example.noop" in served["app"].state.evsched.client.tasks
    bad = CliRunner().invoke(cli(), ["api", "--app", "examples.app:nothing"])
    assert bad.exit_code != 0
