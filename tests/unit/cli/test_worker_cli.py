"""``evsched worker`` as a process: no broker yet, no dispatch key, and its own metrics."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from evsched.adapters.signing import KEY_ENV, KEY_FILE_ENV, UNSIGNED_ENV, DispatchKey
from evsched.cli import app
from evsched.devstack.process import free_port
from evsched.metrics import WorkerInstruments, add_process_collectors, serve_metrics
from tests.prometheus import parse, value

REPO = Path(__file__).resolve().parents[3]
NO_KEY = {KEY_ENV: None, KEY_FILE_ENV: None, UNSIGNED_ENV: None}


@pytest.mark.parametrize(
    "command",
    [["worker", "--app", "examples.app:app"], ["node", "--data-dir", "{tmp}"]],
    ids=["worker", "node"],
)
def test_without_a_dispatch_key_node_and_worker_refuse_to_start(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real setup would bind structlog, for the whole session, to CliRunner's stderr.
    monkeypatch.setattr("evsched.cli.node.configure_logging", lambda **kw: None)
    monkeypatch.setattr("evsched.cli.worker.configure_logging", lambda **kw: None)
    args = [a.replace("{tmp}", str(tmp_path / "node")) for a in command]
    result = CliRunner().invoke(app, args, env=NO_KEY)
    assert result.exit_code == 2, result.output
    assert KEY_ENV in result.output and UNSIGNED_ENV in result.output
    assert not (tmp_path / "node").exists()


def test_the_key_never_appears_in_the_processes_command_line_options() -> None:
    result = CliRunner().invoke(app, ["worker", "--help"])
    assert "key" not in result.output.lower().replace("--start-lookback-s", "")


def test_a_worker_exports_process_and_python_metrics_once() -> None:
    registry = CollectorRegistry()
    instruments = WorkerInstruments(registry)
    add_process_collectors(registry)
    port = free_port()
    server = serve_metrics(instruments.registry, port)
    try:
        add_process_collectors(registry)  # a second time adds nothing and raises nothing
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            samples = parse(response.read().decode())
    finally:
        server.shutdown()
        server.server_close()
    assert value(samples, "process_cpu_seconds_total") > 0
    assert any(name == "python_info" for name, _ in samples)
    assert any(name == "python_gc_collections_total" for name, _ in samples)


def test_a_worker_started_while_the_broker_is_down_retries_and_says_so(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "EVSCHED_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",  # nothing listens there
        KEY_ENV: DispatchKey.generate(),
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
    }
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "evsched", "worker", "--app", "examples.app:app"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while log_path.read_text().count("broker_unavailable") < 2:
            assert worker.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    text = log_path.read_text()
    assert '"retry_in_s": 1.0' in text and '"tries": 2' in text
    assert "Traceback" not in text
