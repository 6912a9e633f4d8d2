"""docker-compose.yml's Kafka agrees with the code: same host port, same single-node settings."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from evsched.devstack.broker import JVM_HEAP_AND_GC
from evsched.devstack.config import render_server_properties
from evsched.devstack.toolchain import KAFKA_VERSION
from evsched.settings import DEFAULT_BROKER_PORT

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read docker-compose.yml")

COMPOSE_FILE = Path(__file__).resolve().parents[1] / "docker-compose.yml"
# The image's start script reads these for the JVM's command line; they are not broker settings.
JVM_ENV = ("KAFKA_HEAP_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS")
# Settings that say where and how the node listens differ on purpose between the two setups.
PLACEMENT = {
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
def kafka() -> dict[str, Any]:
    compose = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    service: dict[str, Any] = compose["services"]["kafka"]
    return service


@pytest.fixture(scope="module")
def env_config(kafka: dict[str, Any]) -> dict[str, str]:
    """The broker settings in the service's environment, as server.properties keys."""
    env = kafka["environment"]
    return {
        key.removeprefix("KAFKA_").lower().replace("_", "."): str(value)
        for key, value in env.items()
        if key.startswith("KAFKA_") and key not in JVM_ENV
    }


def local_config() -> dict[str, str]:
    text = render_server_properties(port=1, controller_port=2, log_dir=Path("/d"))
    lines = (line for line in text.splitlines() if line and not line.startswith("#"))
    return dict(line.split("=", 1) for line in lines)


def test_image_is_the_kafka_version_the_jars_pin(kafka: dict[str, Any]) -> None:
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"


def test_host_port_is_the_default_bootstrap_port(kafka: dict[str, Any]) -> None:
    assert kafka["ports"] == [f"127.0.0.1:{DEFAULT_BROKER_PORT}:{DEFAULT_BROKER_PORT}"]
    advertised = kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    assert f"HOST://127.0.0.1:{DEFAULT_BROKER_PORT}" in advertised
    listeners = kafka["environment"]["KAFKA_LISTENERS"].split(",")
    assert f"HOST://:{DEFAULT_BROKER_PORT}" in listeners


def test_settings_match_the_local_broker(env_config: dict[str, str]) -> None:
    local = {k: v for k, v in local_config().items() if k not in PLACEMENT}
    compose = {k: v for k, v in env_config.items() if k not in PLACEMENT}
    assert compose == local


def test_heap_and_collector_match_the_local_broker(kafka: dict[str, Any]) -> None:
    env = kafka["environment"]
    flags = " ".join(str(env.get(name, "")) for name in JVM_ENV).split()
    assert sorted(flags) == sorted(JVM_HEAP_AND_GC)


def test_topics_are_never_auto_created(env_config: dict[str, str]) -> None:
    assert env_config["auto.create.topics.enable"] == "false"
    assert env_config["transaction.state.log.replication.factor"] == "1"
    assert env_config["transaction.state.log.min.isr"] == "1"


def test_cluster_id_is_kraft_shaped(kafka: dict[str, Any]) -> None:
    cluster_id = kafka["environment"]["CLUSTER_ID"]
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16
    assert not cluster_id.startswith("-")


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    compose = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    found: dict[str, Any] = compose["services"]
    return found


@pytest.mark.parametrize("name", ["topics", "node", "worker", "api"])
def test_evsched_services_are_valid_cli_calls(services: dict[str, Any], name: str) -> None:
    from typer.testing import CliRunner

    from evsched.cli import app

    command = services[name]["command"]
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output


def test_evsched_services_reach_kafka_on_its_internal_listener(services: dict[str, Any]) -> None:
    internal = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")[0]
    address = internal.split("://", 1)[1]
    for name in ("node", "worker", "api"):
        env = services[name]["environment"]
        assert env["EVSCHED_KAFKA_BOOTSTRAP"] == address
        assert services[name]["depends_on"]["topics"]["condition"] == (
            "service_completed_successfully"
        )
    topics = services["topics"]["command"]
    assert topics[topics.index("--bootstrap") + 1] == address
    partitions = topics[topics.index("--partitions") + 1]
    assert services["node"]["environment"]["EVSCHED_EVENT_PARTITIONS"] == partitions
