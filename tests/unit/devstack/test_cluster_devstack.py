"""A local cluster without starting one: ports, per-node configs, versions, the replication rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evsched.adapters.kafka.topics import (
    ObservedTopic,
    Replication,
    TopicSpec,
    choose_replication,
    find_mismatches,
)
from evsched.cli import app
from evsched.devstack.cluster import LocalCluster, is_cluster_dir, node_ports
from evsched.devstack.config import render_log4j_properties, render_server_properties
from evsched.devstack.errors import DevstackError
from evsched.devstack.toolchain import KAFKA_VERSION, KafkaDist, kafka_version
from evsched.settings import Settings, SettingsError

runner = CliRunner()


def properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.mark.parametrize(
    ("brokers", "configured", "expected"),
    [
        (1, None, Replication(1, 1)),
        (2, None, Replication(2, 1)),
        (3, None, Replication(3, 2)),
        (5, None, Replication(3, 2)),
        (0, None, Replication(1, 1)),  # no broker listed yet: creation fails at the broker
        (5, 2, Replication(2, 1)),
        (1, 4, Replication(4, 2)),  # refused when a topic must be created, with the reason
    ],
)
def test_one_replication_rule_for_every_topic(
    brokers: int, configured: int | None, expected: Replication
) -> None:
    assert choose_replication(brokers, configured) == expected


def test_a_topic_below_the_replication_setting_is_reported_by_name() -> None:
    spec = TopicSpec(name="ns.events", partitions=3, replication_factor=3, min_insync=2)
    observed = ObservedTopic(
        partitions=3, replication_factor=1, configs={"min.insync.replicas": "1"}
    )
    found = {(m.topic, m.setting, m.actual, m.expected) for m in find_mismatches(spec, observed)}
    assert found == {
        ("ns.events", "replication.factor", "1", ">= 3"),
        ("ns.events", "min.insync.replicas", "1", ">= 2"),
    }
    stronger = ObservedTopic(
        partitions=3, replication_factor=5, configs={"min.insync.replicas": "3"}
    )
    assert find_mismatches(spec, stronger) == []


def test_replication_factor_setting() -> None:
    assert Settings.from_env({}).replication_factor is None
    assert Settings.from_env({"EVSCHED_REPLICATION_FACTOR": "3"}).replication_factor == 3
    assert "replication_factor=3" in repr(Settings(replication_factor=3))
    for bad in ("0", "three", "-1"):
        with pytest.raises(SettingsError, match="EVSCHED_REPLICATION_FACTOR"):
            Settings.from_env({"EVSCHED_REPLICATION_FACTOR": bad})


def test_nodes_take_every_other_port_and_collisions_are_refused() -> None:
    assert node_ports(19092, 19093, 3) == [(19092, 19093), (19094, 19095), (19096, 19097)]
    with pytest.raises(DevstackError, match="colliding ports"):
        node_ports(19650, 19652, 3)
    with pytest.raises(DevstackError, match="expected 1 to 9"):
        node_ports(19650, 19651, 10)


def test_a_cluster_nodes_config_names_every_voter_and_replicates_internal_topics() -> None:
    voters = "1@127.0.0.1:2,2@127.0.0.1:4,3@127.0.0.1:6"
    config = properties(
        render_server_properties(
            port=3, controller_port=4, log_dir=Path("/d"), node_id=2, voters=voters, brokers=3
        )
    )
    assert (config["node.id"], config["controller.quorum.voters"]) == ("2", voters)
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert config[key] == "3", key
    for key in (
        "min.insync.replicas",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.min.isr",
    ):
        assert config[key] == "2", key


def test_the_kafka_version_is_a_setting_and_4x_logs_through_log4j2(tmp_path: Path) -> None:
    assert kafka_version({}) == KAFKA_VERSION
    assert kafka_version({"EVSCHED_KAFKA_VERSION": "4.4.0"}) == "4.4.0"
    three = KafkaDist(version="3.9.1", cache_root=tmp_path)
    four = KafkaDist(version="4.4.0", cache_root=tmp_path)
    assert (three.log4j2, four.log4j2) == (False, True)
    assert three.logging_args(Path("/l")) == ["-Dlog4j.configuration=file:/l"]
    assert four.logging_args(Path("/l")) == ["-Dlog4j2.configurationFile=/l"]
    log4j2 = render_log4j_properties(log_file=Path("/x/server.log"), log4j2=True)
    assert "appender.file.fileName = /x/server.log" in log4j2
    assert four.cluster_template(3) != four.storage_template


def test_a_cluster_dir_records_its_layout_and_keeps_it(tmp_path: Path) -> None:
    first = LocalCluster(tmp_path, 30000, 30001, brokers=3, version="3.9.1")
    assert not is_cluster_dir(tmp_path)
    first.layout.write(tmp_path / "cluster.json")
    assert is_cluster_dir(tmp_path)
    again = LocalCluster(tmp_path)  # flags of a later call don't move a cluster
    assert again.bootstrap == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    assert again.version == "3.9.1"
    assert again.node(2).voters == "1@127.0.0.1:30001,2@127.0.0.1:30003,3@127.0.0.1:30005"
    with pytest.raises(DevstackError, match=r"holds a Kafka 3\.9\.1 cluster, not 4\.4\.0"):
        LocalCluster(tmp_path, version="4.4.0")


def test_cli_status_of_a_stopped_cluster_lists_every_node(tmp_path: Path) -> None:
    LocalCluster(tmp_path, 30000, 30001, brokers=3).layout.write(tmp_path / "cluster.json")
    result = runner.invoke(app, ["kafka", "status", "--json", "--data-dir", str(tmp_path)])
    assert result.exit_code == 3
    status = json.loads(result.output)
    assert status["running"] is False
    assert status["bootstrap"] == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    assert [b["running"] for b in status["brokers"]] == [False, False, False]
    down = runner.invoke(app, ["kafka", "down", "--data-dir", str(tmp_path)])
    assert (down.exit_code, "not running" in down.output) == (0, True)


def test_cli_refuses_a_cluster_in_a_single_brokers_dir(tmp_path: Path) -> None:
    (tmp_path / "server.properties").write_text("listeners=PLAINTEXT://127.0.0.1:1\n")
    args = ["kafka", "up", "--brokers", "3", "--port", "30000", "--controller-port", "30001"]
    result = runner.invoke(app, [*args, "--data-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert "holds a single broker" in result.output


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, None),
        ([], {"EVSCHED_REPLICATION_FACTOR": "3"}, 3),
        (["--replication-factor", "2"], {"EVSCHED_REPLICATION_FACTOR": "3"}, 2),
    ],
)
def test_kafka_topics_takes_the_replication_setting(
    monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str], expected: int | None
) -> None:
    from evsched.cli import kafka as cli

    seen: dict[str, object] = {}

    async def ensure(*_: object, **options: object) -> list[str]:
        seen.update(options)
        return ["ns.events"]

    monkeypatch.setattr(cli, "ensure_topics", ensure)
    result = runner.invoke(cli.kafka_app, ["topics", *args], env=env)
    assert result.exit_code == 0, result.output
    assert seen["replication_factor"] == expected


def test_kafka_topics_refuses_a_replication_factor_below_one() -> None:
    result = runner.invoke(app, ["kafka", "topics", "--replication-factor", "0"])
    assert result.exit_code == 2
    assert "--replication-factor" in result.output
