"""A misspelt ``EVSCHED_KAFKA_CLIENT`` stops every process that writes events in one clear line:
the worker, the API and the CLI's writing commands name the variable and the choices, exit 2, and
print no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evsched.adapters.signing import KEY_ENV, KEY_FILE_ENV, UNSIGNED_ENV

REPO = Path(__file__).resolve().parents[3]
COMMANDS = {
    "worker": ["worker", "--app", "examples.app:app", "--log-console"],
    "api": ["api", "--no-auth", "--data-dir", "{tmp}", "--log-console"],
    "enqueue": ["enqueue", "example.noop"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_misspelt_kafka_client_is_one_clear_refusal(command: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVSCHED_")}
    env |= {UNSIGNED_ENV: "1", "EVSCHED_KAFKA_CLIENT": "librdkafka"}
    env |= {"EVSCHED_KAFKA_BOOTSTRAP": "127.0.0.1:9"}
    env.pop(KEY_ENV, None)
    env.pop(KEY_FILE_ENV, None)
    args = [a.replace("{tmp}", str(tmp_path / "api")) for a in COMMANDS[command]]
    done = subprocess.run(
        [sys.executable, "-m", "evsched", *args],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    said = " ".join(w for w in done.stderr.split() if w != "│")  # typer boxes its errors
    assert "EVSCHED_KAFKA_CLIENT='librdkafka'" in said, done.stderr
    assert "expected one of aiokafka, confluent" in said, done.stderr
