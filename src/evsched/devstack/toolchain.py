"""The broker's jars from Maven Central and its formatted KRaft storage, both cached once."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evsched.devstack.config import (
    HOST,
    VERSION_ENV,
    new_cluster_id,
    pom_text,
    render_log4j_properties,
)
from evsched.devstack.errors import BrokerFailed, JarsUnavailable, ToolMissing

KAFKA_VERSION = "3.9.1"
# The newest Kafka 4 the suite is run against (docs/operations.md, "Kafka versions").
KAFKA4_VERSION = "4.4.0"
JAVA_HINT = "Java 17+ is required: apt-get install openjdk-17-jre-headless"
MAVEN_HINT = "Maven is required to fetch the Kafka jars once: apt-get install maven"
_RESOLVE_TIMEOUT_S = 600.0
_FORMAT_TIMEOUT_S = 120.0


def require_tool(name: str, hint: str) -> str:
    """The absolute path of ``name`` on PATH, or ToolMissing with an install hint."""
    path = shutil.which(name)
    if path is None:
        raise ToolMissing(hint)
    return path


def kafka_version(environ: dict[str, str] | None = None) -> str:
    """``$EVSCHED_KAFKA_VERSION``, else the version evsched is tested with first."""
    env = os.environ if environ is None else environ
    return env.get(VERSION_ENV, "").strip() or KAFKA_VERSION


def _major(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


@dataclass(frozen=True, slots=True, kw_only=True)
class KafkaDist:
    """One Kafka version's cache: its jars and a formatted storage dir to copy."""

    version: str
    cache_root: Path

    @property
    def home(self) -> Path:
        return self.cache_root / f"kafka-{self.version}"

    @property
    def lib(self) -> Path:
        return self.home / "lib"

    @property
    def classpath(self) -> str:
        return str(self.lib / "*")

    @property
    def log4j2(self) -> bool:
        """Kafka 4 logs through log4j2; 3.x through slf4j 1.7 and reload4j."""
        return _major(self.version) >= 4

    def logging_args(self, config: Path) -> list[str]:
        flag = "-Dlog4j2.configurationFile=" if self.log4j2 else "-Dlog4j.configuration=file:"
        return [f"{flag}{config}"]

    @property
    def storage_template(self) -> Path:
        return self.home / "storage-template"

    def cluster_template(self, nodes: int) -> Path:
        """Formatted storage of an ``nodes``-voter cluster: ``node-<id>/`` each, one cluster id."""
        return self.home / f"storage-template-{nodes}"

    def template(self, nodes: int) -> Path:
        """The formatted storage of a cluster of ``nodes`` (one: ``storage_template``)."""
        return self.storage_template if nodes == 1 else self.cluster_template(nodes)


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(
    command: list[str], timeout_s: float, staging: Path, error: type[Exception]
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise error(f"{Path(command[0]).name} did not finish in {timeout_s:.0f} s") from exc


def _publish(staging: Path, target: Path) -> None:
    """Move a finished dir into place atomically: a cache dir that exists is complete."""
    try:
        staging.rename(target)
    except OSError:
        # Another process published the same thing first; theirs is as good as ours.
        shutil.rmtree(staging, ignore_errors=True)
        if not target.is_dir():
            raise


def ensure_jars(dist: KafkaDist) -> Path:
    """Resolve the broker's runtime jars into ``dist.lib`` unless a previous run did."""
    if dist.lib.is_dir():
        return dist.lib
    mvn = require_tool("mvn", MAVEN_HINT)
    dist.home.mkdir(parents=True, exist_ok=True)
    pom = dist.home / "pom.xml"
    pom.write_text(pom_text(), encoding="utf-8")
    staging = Path(tempfile.mkdtemp(prefix="lib.", dir=dist.home))
    command = [
        mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
        f"-Dkafka.version={dist.version}", "-P", "log4j2" if dist.log4j2 else "log4j1",
    ]  # fmt: skip
    done = _run(command, _RESOLVE_TIMEOUT_S, staging, JarsUnavailable)
    if done.returncode != 0 or not (staging / f"kafka_2.13-{dist.version}.jar").exists():
        shutil.rmtree(staging, ignore_errors=True)
        detail = _tail(done.stdout + done.stderr)
        raise JarsUnavailable(f"mvn could not resolve Kafka {dist.version}:\n{detail}")
    _publish(staging, dist.lib)
    return dist.lib


def _format_properties(log_dir: Path, node_id: int, nodes: int) -> str:
    # Ports don't reach the formatted storage: with static voters only the ids do.
    voters = ",".join(f"{n}@{HOST}:{9093 + n}" for n in range(1, nodes + 1))
    return "\n".join(
        [
            f"node.id={node_id}",
            "process.roles=broker,controller",
            f"controller.quorum.voters={voters}",
            "controller.listener.names=CONTROLLER",
            f"listeners=PLAINTEXT://{HOST}:9092,CONTROLLER://{HOST}:{9093 + node_id}",
            f"log.dirs={log_dir}",
            "",
        ]
    )


def format_storage(
    dist: KafkaDist,
    java: str,
    config: Path,
    log_config: Path,
    cluster_id: str,
    *,
    extra_args: Sequence[str] = (),
) -> None:
    """Format the KRaft storage ``config`` names (its log.dirs); BrokerFailed if it cannot.

    ``extra_args`` go to ``kafka-storage format`` as they are (e.g. ``--add-scram``).
    """
    command = [
        java, "-Xmx256m", *dist.logging_args(log_config),
        "-cp", dist.classpath, "kafka.tools.StorageTool", "format",
        "-t", cluster_id, "-c", str(config), *extra_args,
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_FORMAT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BrokerFailed(
            f"formatting KRaft storage did not finish in {_FORMAT_TIMEOUT_S:.0f} s"
        ) from exc
    if done.returncode != 0:
        raise BrokerFailed(f"formatting KRaft storage failed:\n{_tail(done.stdout + done.stderr)}")


def _format(dist: KafkaDist, java: str, staging: Path, *, node_id: int, nodes: int) -> None:
    """Format one node's KRaft storage into its dir under ``staging``."""
    target = _node_dir(staging, node_id, nodes)
    config = staging / f"server-{node_id}.properties"
    config.write_text(_format_properties(target, node_id, nodes), "utf-8")
    log_config = staging / "log4j.properties"
    log_config.write_text(
        render_log4j_properties(log_file=staging / "format.log", log4j2=dist.log4j2), "utf-8"
    )
    try:
        format_storage(dist, java, config, log_config, cluster_id(staging))
        if not (target / "meta.properties").exists():
            raise BrokerFailed(f"formatting KRaft storage left no {target / 'meta.properties'}")
    except BrokerFailed:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def cluster_id(staging: Path) -> str:
    """The cluster id shared by every node formatted in ``staging`` (made on first use)."""
    path = staging / "cluster.id"
    if not path.exists():
        path.write_text(new_cluster_id(), "utf-8")
    return path.read_text("utf-8")


def ensure_storage_template(dist: KafkaDist, java: str, nodes: int = 1) -> Path:
    """Format KRaft storage once per version and cluster size; data dirs copy from it.

    One node: ``<template>/data``; a cluster: ``<template>/node-<id>`` for each voter.
    """
    target = dist.template(nodes)
    if target.is_dir():
        return target
    staging = Path(tempfile.mkdtemp(prefix="storage.", dir=dist.home))
    for node_id in range(1, nodes + 1):
        _format(dist, java, staging, node_id=node_id, nodes=nodes)
    _publish(staging, target)
    return target


def copy_storage(dist: KafkaDist, log_dir: Path, node_id: int = 1, nodes: int = 1) -> None:
    """Give a fresh data dir formatted storage, unless it already has some."""
    if (log_dir / "meta.properties").exists():
        return
    shutil.rmtree(log_dir, ignore_errors=True)
    template = dist.template(nodes)
    shutil.copytree(_node_dir(template, node_id, nodes), log_dir)


def _node_dir(template: Path, node_id: int, nodes: int) -> Path:
    return template / ("data" if nodes == 1 else f"node-{node_id}")
