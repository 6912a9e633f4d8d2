"""configure_logging: our dependencies' stdlib warnings come out as the same JSON lines as our own
events, with a timestamp, the level and the logger's name. Run in a child, whose stderr is read
whole (this test process's logging stays as pytest set it up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import logging, structlog
    from evsched.logging import configure_logging

    configure_logging()
    configure_logging()  # a second call replaces its handler, it does not print twice
    logging.getLogger("aiokafka.producer.sender").warning("retrying %s", "state-3")
    logging.getLogger("aiokafka.conn").info("below warning: not shown")
    structlog.get_logger().info("partition_phase", partition=3)
    """
)


def _lines() -> list[dict[str, object]]:
    command = [sys.executable, "-c", CHILD]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stderr.splitlines()]


def test_a_dependency_warning_is_one_json_line_with_time_level_and_logger() -> None:
    lines = _lines()
    assert len(lines) == 2
    foreign, ours = lines
    assert foreign["event"] == "retrying state-3"
    assert foreign["level"] == "warning"
    assert foreign["logger"] == "aiokafka.producer.sender"
    assert str(foreign["timestamp"]).endswith("Z")
    assert ours["event"] == "partition_phase"
    assert ours["partition"] == 3
    assert "timestamp" in ours


CLI_CHILD = textwrap.dedent(
    """
    import json, sys
    import structlog
    from evsched import cli

    @cli.app.command("log-probe")
    def log_probe() -> None:
        structlog.get_logger().info("probe_logged", partition=3)
        print(json.dumps({"result": True}))

    sys.argv = ["evsched", "log-probe"]
    cli.main()
    """
)


def test_the_command_line_logs_to_stderr_and_keeps_stdout_for_results() -> None:
    # Unconfigured, structlog prints to stdout: `evsched jobs --json | jq` read log lines.
    command = [sys.executable, "-c", CLI_CHILD]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"result": True}
    (line,) = [json.loads(text) for text in done.stderr.splitlines()]
    assert (line["event"], line["partition"], line["level"]) == ("probe_logged", 3, "info")


CONSOLE_CHILD = textwrap.dedent(
    """
    import structlog
    from evsched.logging import configure_logging

    configure_logging(json=False)
    structlog.get_logger().warning("api_auth_disabled", reason="--no-auth")
    """
)


@pytest.mark.parametrize(("env", "coloured"), [({}, False), ({"FORCE_COLOR": "1"}, True)])
def test_the_console_view_colours_only_a_terminal_or_when_forced(
    env: dict[str, str], coloured: bool
) -> None:
    # stderr is a pipe here, as it is under `evsched dev` (which sets FORCE_COLOR on a TTY) or
    # when a console log is written to a file.
    clean = {k: v for k, v in os.environ.items() if k not in {"FORCE_COLOR", "NO_COLOR"}}
    command = [sys.executable, "-c", CONSOLE_CHILD]
    done = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=60, env={**clean, **env}
    )
    assert done.returncode == 0, done.stderr
    assert "api_auth_disabled" in done.stderr
    assert ("\x1b[" in done.stderr) is coloured
