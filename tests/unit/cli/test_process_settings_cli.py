"""`evsched node`, `evsched worker` (and, for the Kafka client, the API and the CLI's writes) refuse
a bad setting in one line, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from evsched.adapters.signing import KEY_ENV, KEY_FILE_ENV, UNSIGNED_ENV

REPO = Path(__file__).resolve().parents[3]
COMMANDS = {
    "node": ["node", "--data-dir", "{tmp}", "--log-console"],
    "worker": ["worker", "--app", "examples.app:app", "--log-console"],
}
BAD_SETTINGS = {
    "partitions": ("EVSCHED_EVENT_PARTITIONS", "zero"),
    "ca-file": ("EVSCHED_KAFKA_SSL_CAFILE", "/nonexistent/ca.pem"),
    "namespace": ("EVSCHED_NAMESPACE", "a/b"),
}
# Every process that writes events builds its EventLog on the client EVSCHED_KAFKA_CLIENT names.
WRITERS = {
    "worker": COMMANDS["worker"],
    "api": ["api", "--no-auth", "--data-dir", "{tmp}", "--log-console"],
    "enqueue": ["enqueue", "example.noop"],
}


def refused(
    args: list[str], variable: str, bad: str, tmp: Path
) -> subprocess.CompletedProcess[str]:
    """``evsched ARGS`` with ``variable=bad`` and no other evsched setting; it must exit 2."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVSCHED_")}
    env |= {UNSIGNED_ENV: "1", variable: bad, "EVSCHED_KAFKA_BOOTSTRAP": "127.0.0.1:9"}
    env.pop(KEY_ENV, None)
    env.pop(KEY_FILE_ENV, None)
    done = subprocess.run(
        [sys.executable, "-m", "evsched", *[a.replace("{tmp}", str(tmp)) for a in args]],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    return done


@pytest.mark.parametrize("setting", sorted(BAD_SETTINGS))
@pytest.mark.parametrize("process", sorted(COMMANDS))
def test_a_bad_setting_is_one_line_naming_the_variable(
    process: str, setting: str, tmp_path: Path
) -> None:
    variable, bad = BAD_SETTINGS[setting]
    done = refused(COMMANDS[process], variable, bad, tmp_path / "node")
    errors = [line for line in done.stderr.splitlines() if line.startswith(f"evsched {process}:")]
    assert len(errors) == 1, done.stderr
    assert variable in errors[0]


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_misspelt_kafka_client_names_the_variable_and_the_choices(
    command: str, tmp_path: Path
) -> None:
    done = refused(WRITERS[command], "EVSCHED_KAFKA_CLIENT", "librdkafka", tmp_path / "api")
    said = " ".join(w for w in done.stderr.split() if w != "│")  # typer boxes its errors
    assert "EVSCHED_KAFKA_CLIENT='librdkafka'" in said, done.stderr
    assert "expected one of aiokafka, confluent" in said, done.stderr


def test_a_misspelt_node_transactions_mode_names_the_variable_and_the_choices(
    tmp_path: Path,
) -> None:
    done = refused(COMMANDS["node"], "EVSCHED_NODE_TRANSACTIONS", "per-tick", tmp_path / "node")
    errors = [line for line in done.stderr.splitlines() if line.startswith("evsched node:")]
    assert errors == [
        "evsched node: EVSCHED_NODE_TRANSACTIONS='per-tick': expected one of tick, partition"
    ], done.stderr
