"""docker-compose.cluster.yml agrees with `evsched kafka up --brokers 3`: ports, settings, heap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from evsched.devstack.broker import CLUSTER_HEAP_AND_GC
from evsched.devstack.cluster import node_ports
from evsched.devstack.config import render_server_properties
from evsched.devstack.toolchain import KAFKA_VERSION
from evsched.settings import DEFAULT_BROKER_PORT, DEFAULT_CONTROLLER_PORT

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read docker-compose.cluster.yml")

COMPOSE_FILE = Path(__file__).resolve().parents[1] / "docker-compose.cluster.yml"
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
JVM_ENV = ("KAFKA_HEAP_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS")
PLACEMENT = {
    "node.id",
    "listeners",
    "advertised.listeners",
    "listener.security.protocol.map",
    "inter.broker.listener.name",
    "controller.quorum.voters",
    "log.dirs",
    "num.network.threads",
    "num.io.threads",
    "num.recovery.threads.per.data.dir",
}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    compose = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    found: dict[str, Any] = compose["services"]
    return found


def broker_config(service: dict[str, Any]) -> dict[str, str]:
    return {
        key.removeprefix("KAFKA_").lower().replace("_", "."): str(value)
        for key, value in service["environment"].items()
        if key.startswith("KAFKA_") and key not in JVM_ENV
    }


def local_config() -> dict[str, str]:
    text = render_server_properties(port=1, controller_port=2, log_dir=Path("/d"), brokers=3)
    lines = (line for line in text.splitlines() if line and not line.startswith("#"))
    return dict(line.split("=", 1) for line in lines)


@pytest.mark.parametrize("name", BROKERS)
def test_each_broker_is_configured_like_a_local_cluster_node(
    services: dict[str, Any], name: str
) -> None:
    service = services[name]
    assert service["image"] == f"apache/kafka:{KAFKA_VERSION}"
    compose = {k: v for k, v in broker_config(service).items() if k not in PLACEMENT}
    local = {k: v for k, v in local_config().items() if k not in PLACEMENT}
    assert compose == local
    flags = " ".join(str(service["environment"][n]) for n in JVM_ENV).split()
    assert sorted(flags) == sorted(CLUSTER_HEAP_AND_GC)


def test_host_ports_are_the_local_clusters(services: dict[str, Any]) -> None:
    ports = node_ports(DEFAULT_BROKER_PORT, DEFAULT_CONTROLLER_PORT, 3)
    for node_id, (name, (port, _)) in enumerate(zip(BROKERS, ports, strict=True), start=1):
        env = services[name]["environment"]
        assert env["KAFKA_NODE_ID"] == str(node_id)
        assert services[name]["ports"] == [f"127.0.0.1:{port}:{port}"]
        assert f"HOST://127.0.0.1:{port}" in env["KAFKA_ADVERTISED_LISTENERS"].split(",")
        voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
        assert voters == [f"{i}@kafka-{i}:19093" for i in (1, 2, 3)]


def test_evsched_services_use_every_broker_and_three_replicas(services: dict[str, Any]) -> None:
    internal = ",".join(f"{name}:29092" for name in BROKERS)
    topics = services["topics"]["command"]
    assert topics[topics.index("--bootstrap") + 1] == internal
    assert topics[topics.index("--replication-factor") + 1] == "3"
    assert set(services["topics"]["depends_on"]) == set(BROKERS)
    for name in ("node", "worker", "api"):
        env = services[name]["environment"]
        assert env["EVSCHED_KAFKA_BOOTSTRAP"] == internal
        assert env["EVSCHED_REPLICATION_FACTOR"] == "3"


@pytest.mark.parametrize("name", ["topics", "node", "worker", "api"])
def test_evsched_services_are_valid_cli_calls(services: dict[str, Any], name: str) -> None:
    from typer.testing import CliRunner

    from evsched.cli import app

    result = CliRunner().invoke(app, [*services[name]["command"], "--help"])
    assert result.exit_code == 0, result.output
