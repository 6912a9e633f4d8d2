"""`evsched node` and `evsched worker` refuse a bad setting in one line, exit 2, no traceback."""

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


@pytest.mark.parametrize("setting", sorted(BAD_SETTINGS))
@pytest.mark.parametrize("process", sorted(COMMANDS))
def test_a_bad_setting_is_one_line_naming_the_variable(
    process: str, setting: str, tmp_path: Path
) -> None:
    variable, bad = BAD_SETTINGS[setting]
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVSCHED_")}
    env |= {UNSIGNED_ENV: "1", variable: bad, "EVSCHED_KAFKA_BOOTSTRAP": "127.0.0.1:9"}
    env.pop(KEY_ENV, None)
    env.pop(KEY_FILE_ENV, None)
    args = [a.replace("{tmp}", str(tmp_path / "node")) for a in COMMANDS[process]]
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
    errors = [line for line in done.stderr.splitlines() if line.startswith(f"evsched {process}:")]
    assert len(errors) == 1, done.stderr
    assert variable in errors[0]
