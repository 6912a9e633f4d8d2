"""The broker's jars from Maven Central and its formatted KRaft storage, both cached once."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from evsched.devstack.config import HOST, new_cluster_id, pom_text, render_log4j_properties
from evsched.devstack.errors import BrokerFailed, JarsUnavailable, ToolMissing

KAFKA_VERSION = "3.9.1"
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
    def storage_template(self) -> Path:
        return self.home / "storage-template"


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
        f"-Dkafka.version={dist.version}",
    ]  # fmt: skip
    done = _run(command, _RESOLVE_TIMEOUT_S, staging, JarsUnavailable)
    if done.returncode != 0 or not (staging / f"kafka_2.13-{dist.version}.jar").exists():
        shutil.rmtree(staging, ignore_errors=True)
        detail = _tail(done.stdout + done.stderr)
        raise JarsUnavailable(f"mvn could not resolve Kafka {dist.version}:\n{detail}")
    _publish(staging, dist.lib)
    return dist.lib


def _format_properties(log_dir: Path) -> str:
    # Ports don't reach the formatted storage: with static voters only the ids do.
    return "\n".join(
        [
            "node.id=1",
            "process.roles=broker,controller",
            f"controller.quorum.voters=1@{HOST}:9093",
            "controller.listener.names=CONTROLLER",
            f"listeners=PLAINTEXT://{HOST}:9092,CONTROLLER://{HOST}:9093",
            f"log.dirs={log_dir}",
            "",
        ]
    )


def ensure_storage_template(dist: KafkaDist, java: str) -> Path:
    """Format KRaft storage once per version; later data dirs copy ``<template>/data``."""
    if dist.storage_template.is_dir():
        return dist.storage_template
    staging = Path(tempfile.mkdtemp(prefix="storage.", dir=dist.home))
    (staging / "server.properties").write_text(_format_properties(staging / "data"), "utf-8")
    (staging / "log4j.properties").write_text(
        render_log4j_properties(log_file=staging / "format.log"), "utf-8"
    )
    command = [
        java, "-Xmx256m", f"-Dlog4j.configuration=file:{staging / 'log4j.properties'}",
        "-cp", dist.classpath, "kafka.tools.StorageTool", "format",
        "-t", new_cluster_id(), "-c", str(staging / "server.properties"),
    ]  # fmt: skip
    done = _run(command, _FORMAT_TIMEOUT_S, staging, BrokerFailed)
    if done.returncode != 0 or not (staging / "data" / "meta.properties").exists():
        shutil.rmtree(staging, ignore_errors=True)
        raise BrokerFailed(f"formatting KRaft storage failed:\n{_tail(done.stdout + done.stderr)}")
    _publish(staging, dist.storage_template)
    return dist.storage_template


def copy_storage(dist: KafkaDist, log_dir: Path) -> None:
    """Give a fresh data dir formatted storage, unless it already has some."""
    if (log_dir / "meta.properties").exists():
        return
    shutil.rmtree(log_dir, ignore_errors=True)
    shutil.copytree(dist.storage_template / "data", log_dir)
