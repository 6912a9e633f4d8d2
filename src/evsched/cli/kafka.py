"""``evsched kafka up|down|status|topics``: a local broker or cluster for development, no Docker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from evsched.adapters.kafka.topics import TopicProvisioningError, ensure_topics
from evsched.devstack.broker import BrokerStatus, LocalBroker
from evsched.devstack.cluster import ClusterStatus, LocalCluster, is_cluster_dir
from evsched.devstack.config import DATA_DIR_ENV, VERSION_ENV, default_data_dir
from evsched.devstack.errors import DevstackError
from evsched.devstack.toolchain import KAFKA_VERSION
from evsched.errors import BrokerAccessRefused
from evsched.settings import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_BROKER_PORT,
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_EVENT_PARTITIONS,
    DEFAULT_NAMESPACE,
    DISPATCH_PARTITIONS_ENV,
    REPLICATION_FACTOR_ENV,
    Settings,
    SettingsError,
)

kafka_app = typer.Typer(
    no_args_is_help=True,
    help="Run a local Kafka broker or cluster from Maven Central jars (Java 17+, Maven needed).",
)

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar=DATA_DIR_ENV,
        help="Broker state, config, logs and pid file. [default: ~/.local/share/evsched/kafka]",
        show_default=False,
    ),
]
Port = Annotated[int, typer.Option("--port", help="Client (PLAINTEXT) port on 127.0.0.1.")]
ControllerPort = Annotated[int, typer.Option("--controller-port", help="KRaft controller port.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")]
EXIT_STOPPED = 3  # LSB's "program is not running", as `systemctl status` uses it


Brokers = Annotated[
    int,
    typer.Option(
        "--brokers",
        min=1,
        max=9,
        help="Nodes (broker + controller each, all KRaft voters). Node i listens on "
        "port+2(i-1) and controller-port+2(i-1).",
    ),
]
KafkaVersion = Annotated[
    str | None,
    typer.Option(
        "--kafka-version",
        envvar=VERSION_ENV,
        help=f"Kafka version from Maven Central, 3.9.x or 4.x. [default: {KAFKA_VERSION}]",
        show_default=False,
    ),
]
Status = BrokerStatus | ClusterStatus


def _echo_status(status: Status, as_json: bool, text: str) -> None:
    typer.echo(json.dumps(status.as_dict()) if as_json else text)


def _fail(error: Exception) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(1)


def _pids(status: Status) -> str:
    if isinstance(status, ClusterStatus):
        return "pids " + ", ".join(str(pid) for pid in status.pids)
    return f"pid {status.pid}"


def _up_text(status: Status) -> str:
    if status.already_running:
        return (
            f"Kafka is already running at {status.bootstrap} "
            f"({_pids(status)}, data in {status.data_dir})"
        )
    return (
        f"Kafka {status.version} is up at {status.bootstrap} "
        f"({_pids(status)}, started in {status.started_in_s:.1f} s, data in {status.data_dir})"
    )


@kafka_app.command()
def up(
    *,
    data_dir: DataDir = None,
    port: Port = DEFAULT_BROKER_PORT,
    controller_port: ControllerPort = DEFAULT_CONTROLLER_PORT,
    brokers: Brokers = 1,
    kafka_version: KafkaVersion = None,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Seconds to wait for it.")] = 120.0,
    as_json: AsJson = False,
) -> None:
    """Start the broker or cluster (first run: fetch jars, format storage); print the bootstrap.

    Exits 0 without starting another when this data dir's broker already runs; a cluster with a
    stopped node gets that node started again.
    """
    try:
        if brokers > 1 or is_cluster_dir(data_dir):
            status: Status = LocalCluster(
                data_dir,
                port,
                controller_port,
                brokers=brokers,
                version=kafka_version,
                ready_timeout_s=timeout_s,
            ).up()
        else:
            broker = LocalBroker(
                data_dir, port, controller_port, version=kafka_version, ready_timeout_s=timeout_s
            )
            status = broker.up()
    except DevstackError as error:
        raise _fail(error) from None
    _echo_status(status, as_json, _up_text(status))


@kafka_app.command()
def down(data_dir: DataDir = None) -> None:
    """Stop the broker or every node of the cluster started from this data dir (nothing else)."""
    try:
        if is_cluster_dir(data_dir):
            pids = LocalCluster(data_dir).down()
        else:
            pid = LocalBroker(data_dir).down()
            pids = [pid] if pid else []
    except DevstackError as error:
        raise _fail(error) from None
    where = (data_dir or default_data_dir()).absolute()
    listed = ", ".join(str(pid) for pid in pids)
    typer.echo(f"Stopped Kafka (pid {listed})." if pids else f"Kafka is not running ({where}).")


@kafka_app.command()
def status(data_dir: DataDir = None, as_json: AsJson = False) -> None:
    """Say whether this data dir's broker (every node) runs, and where. Exits 3 unless all run."""
    current: Status
    if is_cluster_dir(data_dir):
        current = LocalCluster(data_dir).status()
        states = ", ".join(
            f"{b.bootstrap} {'up' if b.running else 'down'}" for b in current.brokers
        )
        state = "running" if current.running else "degraded"
        text = f"{state}: {states} (data in {current.data_dir})"
    else:
        current = LocalBroker(data_dir).status()
        text = f"running at {current.bootstrap} (pid {current.pid}, data in {current.data_dir})"
    if not any(b.running for b in _brokers(current)):
        text = f"stopped (data dir {current.data_dir})"
    _echo_status(current, as_json, text)
    if not current.running:
        raise typer.Exit(EXIT_STOPPED)


def _brokers(status: Status) -> tuple[BrokerStatus, ...]:
    return status.brokers if isinstance(status, ClusterStatus) else (status,)


@kafka_app.command()
def topics(
    *,
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", help="A dispatch queue (repeatable). [default: default]"),
    ] = None,
    bootstrap: Annotated[str, typer.Option(envvar="EVSCHED_KAFKA_BOOTSTRAP")] = DEFAULT_BOOTSTRAP,
    namespace: Annotated[str, typer.Option(envvar="EVSCHED_NAMESPACE")] = DEFAULT_NAMESPACE,
    partitions: Annotated[
        int, typer.Option("--partitions", envvar="EVSCHED_EVENT_PARTITIONS")
    ] = DEFAULT_EVENT_PARTITIONS,
    dispatch_partitions: Annotated[
        int | None,
        typer.Option(
            "--dispatch-partitions",
            envvar=DISPATCH_PARTITIONS_ENV,
            min=1,
            help="Partitions of each new dispatch topic: a pool's workers past this sit idle. "
            "[default: as many as the events]",
            show_default=False,
        ),
    ] = None,
    replication_factor: Annotated[
        int | None,
        typer.Option(
            "--replication-factor",
            envvar=REPLICATION_FACTOR_ENV,
            min=1,
            help="Replicas per partition; min ISR is 2 from 3. [default: min(3, brokers)]",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Create the namespace's topics; check that existing ones are configured as evsched needs.

    Connects with the TLS/SASL settings of ``EVSCHED_KAFKA_*``, as every evsched process does.
    """
    try:
        security = Settings.from_env().kafka_options
    except SettingsError as error:
        raise _fail(error) from None
    try:
        names = asyncio.run(
            ensure_topics(
                bootstrap,
                namespace,
                event_partitions=partitions,
                queues=queue or ["default"],
                dispatch_partitions=dispatch_partitions,
                replication_factor=replication_factor,
                **security,
            )
        )
    except (TopicProvisioningError, BrokerAccessRefused) as error:
        raise _fail(error) from None
    for name in names:
        typer.echo(name)
