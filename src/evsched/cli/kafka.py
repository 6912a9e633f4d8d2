"""``evsched kafka up|down|status|topics``: a local broker for development, no Docker needed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from evsched.adapters.topics import TopicProvisioningError, ensure_topics
from evsched.devstack.broker import BrokerStatus, LocalBroker
from evsched.devstack.config import DATA_DIR_ENV
from evsched.devstack.errors import DevstackError
from evsched.errors import BrokerAccessRefused
from evsched.settings import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_BROKER_PORT,
    DEFAULT_CONTROLLER_PORT,
    DEFAULT_EVENT_PARTITIONS,
    DEFAULT_NAMESPACE,
    Settings,
    SettingsError,
)

kafka_app = typer.Typer(
    no_args_is_help=True,
    help="Run a single-node Kafka broker from Maven Central jars (Java 17+ and Maven needed).",
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


def _echo_status(status: BrokerStatus, as_json: bool, text: str) -> None:
    typer.echo(json.dumps(status.as_dict()) if as_json else text)


def _fail(error: Exception) -> typer.Exit:
    typer.echo(f"error: {error}", err=True)
    return typer.Exit(1)


@kafka_app.command()
def up(
    data_dir: DataDir = None,
    port: Port = DEFAULT_BROKER_PORT,
    controller_port: ControllerPort = DEFAULT_CONTROLLER_PORT,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Seconds to wait for it.")] = 90.0,
    as_json: AsJson = False,
) -> None:
    """Start the broker (first run: fetch jars, format storage) and print its bootstrap address.

    Exits 0 without starting another when this data dir's broker already runs.
    """
    broker = LocalBroker(data_dir, port, controller_port, ready_timeout_s=timeout_s)
    try:
        status = broker.up()
    except DevstackError as error:
        raise _fail(error) from None
    if status.already_running:
        text = (
            f"Kafka is already running at {status.bootstrap} "
            f"(pid {status.pid}, data in {status.data_dir})"
        )
    else:
        text = (
            f"Kafka {status.version} is up at {status.bootstrap} "
            f"(pid {status.pid}, started in {status.started_in_s:.1f} s, data in {status.data_dir})"
        )
    _echo_status(status, as_json, text)


@kafka_app.command()
def down(data_dir: DataDir = None) -> None:
    """Stop the broker started from this data dir (and nothing else)."""
    broker = LocalBroker(data_dir)
    try:
        pid = broker.down()
    except DevstackError as error:
        raise _fail(error) from None
    where = broker.files.data_dir
    typer.echo(
        f"Stopped Kafka (pid {pid})." if pid else f"Kafka is not running (data dir {where})."
    )


@kafka_app.command()
def status(data_dir: DataDir = None, as_json: AsJson = False) -> None:
    """Say whether this data dir's broker runs, and where. Exits 3 when it is stopped."""
    current = LocalBroker(data_dir).status()
    if current.running:
        text = f"running at {current.bootstrap} (pid {current.pid}, data in {current.data_dir})"
    else:
        text = f"stopped (data dir {current.data_dir})"
    _echo_status(current, as_json, text)
    if not current.running:
        raise typer.Exit(EXIT_STOPPED)


@kafka_app.command()
def topics(
    queue: Annotated[
        list[str] | None,
        typer.Option("--queue", help="A dispatch queue (repeatable). [default: default]"),
    ] = None,
    bootstrap: Annotated[str, typer.Option(envvar="EVSCHED_KAFKA_BOOTSTRAP")] = DEFAULT_BOOTSTRAP,
    namespace: Annotated[str, typer.Option(envvar="EVSCHED_NAMESPACE")] = DEFAULT_NAMESPACE,
    partitions: Annotated[
        int, typer.Option("--partitions", envvar="EVSCHED_EVENT_PARTITIONS")
    ] = DEFAULT_EVENT_PARTITIONS,
    replication_factor: Annotated[int, typer.Option("--replication-factor")] = 1,
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
                replication_factor=replication_factor,
                **security,
            )
        )
    except (TopicProvisioningError, BrokerAccessRefused) as error:
        raise _fail(error) from None
    for name in names:
        typer.echo(name)
