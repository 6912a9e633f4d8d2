"""The local broker harness without a broker: config, ports, pid files, tool checks, the CLI."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evsched.cli import app
from evsched.devstack import broker as broker_module
from evsched.devstack.broker import LocalBroker
from evsched.devstack.config import (
    BrokerFiles,
    default_cache_root,
    default_data_dir,
    new_cluster_id,
    pom_text,
    read_ports,
    render_server_properties,
    write_broker_config,
)
from evsched.devstack.errors import BrokerFailed, PortInUse, ToolMissing
from evsched.devstack.process import free_port, is_alive, port_in_use, write_pid
from evsched.devstack.readiness import metadata_answers, run_sync
from evsched.devstack.toolchain import KAFKA_VERSION, KafkaDist

runner = CliRunner()


def properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.fixture
def listening() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def fake_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only the programs a test puts there."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    return bin_dir


def add_program(bin_dir: Path, name: str, script: str) -> None:
    program = bin_dir / name
    program.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    program.chmod(0o755)


def local_broker(tmp_path: Path, **options: float) -> LocalBroker:
    port, controller_port = free_port(), free_port()
    return LocalBroker(
        tmp_path / "data", port, controller_port, cache_root=tmp_path / "cache", **options
    )


def fake_broker(broker: LocalBroker, *, ignore_sigterm: bool = False) -> subprocess.Popen[str]:
    """A process that looks like our broker (kafka.Kafka + our config path on its command line)."""
    write_broker_config(broker.files, port=broker.port, controller_port=broker.controller_port)
    code = "import signal, sys, time\n"
    if ignore_sigterm:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(60)\n"
    args = [sys.executable, "-c", code, "kafka.Kafka", str(broker.files.server_properties)]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    assert child.stdout.readline() == "ready\n"
    write_pid(broker.files.pid_file, child.pid)
    return child


# --- config ----------------------------------------------------------------------------------


def test_server_properties_make_one_loopback_node_for_transactions() -> None:
    config = properties(
        render_server_properties(port=19092, controller_port=19093, log_dir=Path("/d"))
    )
    assert config["process.roles"] == "broker,controller"
    assert config["node.id"] == "1"
    assert config["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert config["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert config["controller.listener.names"] == "CONTROLLER"
    assert config["log.dirs"] == "/d"
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
    ):
        assert config[key] == "1", key
    assert int(config["offsets.topic.num.partitions"]) <= 4
    assert int(config["transaction.state.log.num.partitions"]) <= 4
    assert config["group.initial.rebalance.delay.ms"] == "0"
    # A 3 s session (docs/operations.md, "Failover") must be allowed: Kafka's minimum is 6 s.
    assert int(config["group.min.session.timeout.ms"]) <= 3_000
    assert config["auto.create.topics.enable"] == "false"


def test_written_config_tells_the_ports(tmp_path: Path) -> None:
    files = BrokerFiles(data_dir=tmp_path)
    assert read_ports(files.server_properties) is None
    write_broker_config(files, port=29092, controller_port=29093)
    assert read_ports(files.server_properties) == (29092, 29093)
    assert f"File={files.server_log}" in files.log4j_properties.read_text(encoding="utf-8")


def test_pom_pins_the_version_the_code_expects() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.fromstring(pom_text())
    assert root.findtext("m:properties/m:kafka.version", namespaces=ns) == KAFKA_VERSION
    artifacts = {
        d.findtext("m:artifactId", namespaces=ns) for d in root.iterfind(".//m:dependency", ns)
    }
    assert artifacts == {"kafka_2.13", "slf4j-reload4j", "log4j-slf4j-impl"}
    profiles = {p.findtext("m:id", namespaces=ns) for p in root.iterfind(".//m:profile", ns)}
    assert profiles == {"log4j1", "log4j2"}  # chosen by KafkaDist.log4j2


def test_cluster_ids_are_kraft_shaped() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert set(cluster_id) <= set(
            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
        )


def test_dirs_follow_env_overrides(tmp_path: Path) -> None:
    assert default_data_dir({"EVSCHED_KAFKA_DATA": str(tmp_path)}) == tmp_path
    assert default_data_dir({"XDG_DATA_HOME": "/x"}) == Path("/x/evsched/kafka")
    assert default_cache_root({"EVSCHED_KAFKA_CACHE": str(tmp_path)}) == tmp_path
    assert default_cache_root({"XDG_CACHE_HOME": "/c"}) == Path("/c/evsched")


# --- ports and tools ---------------------------------------------------------------------------


def test_port_in_use_sees_a_listener_only(listening: int) -> None:
    assert port_in_use(listening)
    assert not port_in_use(free_port())


def test_up_refuses_a_taken_port_and_starts_nothing(
    tmp_path: Path, fake_bin: Path, listening: int
) -> None:
    add_program(fake_bin, "java", "exit 99")
    broker = LocalBroker(tmp_path / "data", listening, free_port(), cache_root=tmp_path / "cache")
    with pytest.raises(PortInUse, match=f"port {listening} is in use by another process"):
        broker.up()
    assert not broker.files.pid_file.exists()
    assert not (tmp_path / "cache").exists()


def test_cli_reports_a_taken_port(tmp_path: Path, fake_bin: Path, listening: int) -> None:
    add_program(fake_bin, "java", "exit 99")
    args = ["kafka", "up", "--port", str(listening), "--data-dir", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert f"port {listening} is in use by another process" in result.output


def test_missing_java_says_what_to_install(tmp_path: Path, fake_bin: Path) -> None:
    result = runner.invoke(app, ["kafka", "up", "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "Java 17+ is required: apt-get install openjdk-17-jre-headless" in result.output


def test_missing_maven_says_what_to_install(tmp_path: Path, fake_bin: Path) -> None:
    add_program(fake_bin, "java", "exit 99")
    with pytest.raises(ToolMissing, match=r"Maven is required.*apt-get install maven"):
        local_broker(tmp_path).up()


# --- the process -------------------------------------------------------------------------------


@pytest.fixture
def no_toolchain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skip jar resolution and storage formatting: the tests bring their own `java`."""
    for name in ("ensure_jars", "ensure_storage_template", "copy_storage"):
        monkeypatch.setattr(broker_module, name, lambda *_: None)


@pytest.mark.usefixtures("no_toolchain")
def test_a_broker_that_dies_at_start_is_reported_with_its_log(
    tmp_path: Path, fake_bin: Path
) -> None:
    add_program(fake_bin, "java", 'echo "Error: could not find kafka.Kafka" >&2; exit 7')
    broker = local_broker(tmp_path)
    with pytest.raises(BrokerFailed, match="exited with code 7") as caught:
        broker.up()
    assert "could not find kafka.Kafka" in str(caught.value)
    assert not broker.files.pid_file.exists()


@pytest.mark.usefixtures("no_toolchain")
def test_a_broker_that_never_answers_is_stopped(tmp_path: Path, fake_bin: Path) -> None:
    add_program(fake_bin, "java", "exec /bin/sleep 30")
    broker = local_broker(tmp_path, ready_timeout_s=0.5)
    with pytest.raises(BrokerFailed, match="did not answer"):
        broker.up()
    assert not broker.files.pid_file.exists()
    assert broker.status().running is False


def test_a_dead_pid_in_the_pid_file_is_stale(tmp_path: Path) -> None:
    broker = local_broker(tmp_path)
    exited = subprocess.Popen(["true"])
    exited.wait()
    broker.files.data_dir.mkdir(parents=True)
    write_pid(broker.files.pid_file, exited.pid)

    assert broker.status().running is False
    assert not broker.files.pid_file.exists()


def test_a_pid_that_is_not_our_broker_is_never_signalled(tmp_path: Path) -> None:
    broker = local_broker(tmp_path)
    write_broker_config(broker.files, port=broker.port, controller_port=broker.controller_port)
    write_pid(broker.files.pid_file, os.getpid())

    assert broker.down() is None
    assert is_alive(os.getpid())
    assert not broker.files.pid_file.exists()


def test_up_twice_reports_the_running_broker_and_down_stops_it(tmp_path: Path) -> None:
    broker = local_broker(tmp_path)
    child = fake_broker(broker)
    try:
        again = broker.up()
        assert (again.running, again.already_running, again.pid) == (True, True, child.pid)
        assert again.bootstrap == broker.bootstrap
        assert broker.down() == child.pid
        assert child.wait(timeout=5) == -15
        assert not broker.files.pid_file.exists()
        assert broker.down() is None
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()


def test_down_kills_a_broker_that_ignores_sigterm(tmp_path: Path) -> None:
    broker = local_broker(tmp_path, stop_timeout_s=0.3)
    child = fake_broker(broker, ignore_sigterm=True)
    try:
        assert broker.down() == child.pid
        assert child.wait(timeout=5) == -9
    finally:
        child.kill()
        child.wait()
        assert child.stdout is not None
        child.stdout.close()


def test_cli_status_json_and_exit_code_when_stopped(tmp_path: Path) -> None:
    result = runner.invoke(app, ["kafka", "status", "--json", "--data-dir", str(tmp_path)])
    assert result.exit_code == 3
    status = json.loads(result.output)
    assert status["running"] is False
    assert status["data_dir"] == str(tmp_path.absolute())
    assert status["version"] == KAFKA_VERSION


def test_cli_down_when_nothing_runs(tmp_path: Path) -> None:
    result = runner.invoke(app, ["kafka", "down", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert "not running" in result.output


# --- the real thing ----------------------------------------------------------------------------


@pytest.mark.slow
def test_real_broker_up_twice_then_down_leaves_nothing(tmp_path: Path) -> None:
    if shutil.which("java") is None or shutil.which("mvn") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true: java and mvn must be installed")
        pytest.skip("needs java and mvn")
    broker = local_broker(tmp_path, ready_timeout_s=120.0)
    broker.dist = KafkaDist(version=KAFKA_VERSION, cache_root=default_cache_root())
    first = broker.up()
    try:
        assert first.running and not first.already_running
        assert run_sync(metadata_answers(first.bootstrap))
        second = broker.up()
        assert (second.already_running, second.pid) == (True, first.pid)
        assert broker.status().pid == first.pid
    finally:
        stopped = broker.down()
    assert stopped == first.pid
    assert first.pid is not None and not is_alive(first.pid)
    assert not broker.files.pid_file.exists()
    assert broker.status().running is False
