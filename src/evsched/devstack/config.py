"""Where the local broker keeps its files, and the config files it is started with."""

from __future__ import annotations

import base64
import os
import secrets
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template

from evsched.adapters.kafka.topics import choose_replication
from evsched.settings import DEFAULT_CONTROLLER_PORT

HOST = "127.0.0.1"
DATA_DIR_ENV = "EVSCHED_KAFKA_DATA"
CACHE_DIR_ENV = "EVSCHED_KAFKA_CACHE"
VERSION_ENV = "EVSCHED_KAFKA_VERSION"


def default_data_dir(environ: dict[str, str] | None = None) -> Path:
    """``$EVSCHED_KAFKA_DATA``, else ``$XDG_DATA_HOME/evsched/kafka`` (``~/.local/share``)."""
    env = os.environ if environ is None else environ
    if env.get(DATA_DIR_ENV):
        return Path(env[DATA_DIR_ENV]).expanduser()
    base = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "evsched" / "kafka"


def default_cache_root(environ: dict[str, str] | None = None) -> Path:
    """``$EVSCHED_KAFKA_CACHE``, else ``$XDG_CACHE_HOME/evsched`` (``~/.cache``)."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_DIR_ENV):
        return Path(env[CACHE_DIR_ENV]).expanduser()
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "evsched"


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerFiles:
    """The layout of one broker's data dir."""

    data_dir: Path

    @property
    def server_properties(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log4j_properties(self) -> Path:
        return self.data_dir / "log4j.properties"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def lock_file(self) -> Path:
        return self.data_dir / ".lock"

    @property
    def version_file(self) -> Path:
        """The Kafka version that formatted this data dir's storage."""
        return self.data_dir / "kafka-version"

    @property
    def log_dir(self) -> Path:
        """Kafka's ``log.dirs``: the KRaft metadata and the topic partitions."""
        return self.data_dir / "kraft"

    @property
    def server_log(self) -> Path:
        return self.data_dir / "logs" / "server.log"

    @property
    def console_log(self) -> Path:
        """The JVM's stdout and stderr (crashes before log4j is up land here)."""
        return self.data_dir / "logs" / "console.log"


def _template(name: str) -> Template:
    return Template(resources.files(__package__).joinpath(name).read_text(encoding="utf-8"))


def render_server_properties(
    *,
    port: int,
    controller_port: int,
    log_dir: Path,
    node_id: int = 1,
    voters: str | None = None,
    brokers: int = 1,
) -> str:
    """One node's config; a cluster's nodes share ``voters`` (``id@host:port,...``)."""
    # The broker's internal topics follow the same rule as evsched's own (min ISR 2 from RF 3).
    replication = choose_replication(brokers)
    return _template("server.properties.in").substitute(
        host=HOST,
        port=port,
        controller_port=controller_port,
        log_dir=log_dir,
        node_id=node_id,
        voters=voters or f"{node_id}@{HOST}:{controller_port}",
        replicas=replication.factor,
        min_isr=replication.min_insync,
    )


def render_log4j_properties(*, log_file: Path, log4j2: bool = False) -> str:
    """Kafka 3 logs through log4j 1 (reload4j), Kafka 4 through log4j2: different formats."""
    name = "log4j2.properties.in" if log4j2 else "log4j.properties.in"
    return _template(name).substitute(log_file=log_file)


def pom_text() -> str:
    return resources.files(__package__).joinpath("kafka-pom.xml").read_text(encoding="utf-8")


def write_broker_config(
    files: BrokerFiles,
    *,
    port: int,
    controller_port: int,
    node_id: int = 1,
    voters: str | None = None,
    brokers: int = 1,
    log4j2: bool = False,
) -> None:
    """Write the broker's server and log4j configs into its data dir."""
    files.server_log.parent.mkdir(parents=True, exist_ok=True)
    server = render_server_properties(
        port=port,
        controller_port=controller_port,
        log_dir=files.log_dir,
        node_id=node_id,
        voters=voters,
        brokers=brokers,
    )
    files.server_properties.write_text(server, encoding="utf-8")
    files.log4j_properties.write_text(
        render_log4j_properties(log_file=files.server_log, log4j2=log4j2), encoding="utf-8"
    )


def read_ports(server_properties: Path) -> tuple[int, int] | None:
    """The (broker, controller) ports a written config listens on, or None without one."""
    try:
        text = server_properties.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    ports: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "listeners":
            for listener in value.split(","):
                name, _, address = listener.strip().partition("://")
                ports[name] = int(address.rpartition(":")[2])
    if "PLAINTEXT" not in ports:
        return None
    return ports["PLAINTEXT"], ports.get("CONTROLLER", DEFAULT_CONTROLLER_PORT)


def new_cluster_id() -> str:
    """A KRaft cluster id: URL-safe base64 of 16 random bytes, unpadded, not starting with '-'."""
    while True:
        cluster_id = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
