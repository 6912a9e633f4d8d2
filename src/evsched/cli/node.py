"""``evsched node``: own events partitions, fold them into RocksDB and run the scheduler."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Annotated

import typer

from evsched.adapters.kafka.client_logs import hide_startup_noise
from evsched.adapters.kafka.topics import TopicMisconfigured, TopicRefused
from evsched.cli.options import LogJson, MetricsAddr, metrics_port_option
from evsched.cli.worker import load_dispatch_key, load_node_keyring
from evsched.core.bounds import MAX_PRELEASE_MS
from evsched.core.planner import PlannerBudgets
from evsched.errors import BrokerAccessRefused
from evsched.logging import configure_logging
from evsched.runtime.node.main import serve_node
from evsched.runtime.node.node import STEP_INTERVAL_MS, NodeConfig, tick_transactions_from_env
from evsched.runtime.node.standby import parse_partitions
from evsched.settings import Settings, SettingsError


def node_command(
    *,
    data_dir: Annotated[
        Path, typer.Option("--data-dir", envvar="EVSCHED_NODE_DATA_DIR", help="RocksDB indexes.")
    ] = Path("./evsched-data/node"),
    node_id: Annotated[
        str | None, typer.Option("--node-id", help="Stable name in logs and event sources.")
    ] = None,
    max_in_flight: Annotated[
        int,
        typer.Option(
            "--max-in-flight", min=1, help="Leased + running jobs per queue, on this node."
        ),
    ] = 1_000,
    max_unstarted: Annotated[
        int,
        typer.Option(
            "--max-unstarted",
            min=1,
            help="Leased jobs no worker has started yet, per queue, on this node (backpressure); "
            "raised for a queue whose workers start jobs quickly (--unstarted-horizon-ms).",
        ),
    ] = 100,
    unstarted_horizon_ms: Annotated[
        int,
        typer.Option(
            "--unstarted-horizon-ms",
            min=0,
            help="A queue may have this long of its recent starts leased but unstarted, above "
            "--max-unstarted and up to --max-in-flight; 0 keeps --max-unstarted fixed.",
        ),
    ] = 1_000,
    dispatch_timeout_s: Annotated[
        float, typer.Option("--dispatch-timeout-s", min=0.1, help="Time for a worker to start.")
    ] = 30.0,
    prelease_ms: Annotated[
        int,
        typer.Option(
            "--prelease-ms",
            envvar="EVSCHED_PRELEASE_MS",
            min=0,
            max=MAX_PRELEASE_MS,
            help="Lease delayed jobs this long before their run_at; their worker starts them "
            "at run_at by its own timer (0: lease only due jobs).",
        ),
    ] = 1_000,
    step_interval_ms: Annotated[
        int,
        typer.Option(
            "--step-interval-ms",
            envvar="EVSCHED_NODE_STEP_INTERVAL_MS",
            min=0,
            max=1_000,
            help="Each partition steps at most once per interval: under load, fewer and larger "
            "transactions (less CPU per job) for up to this much more latency; 0: at once.",
        ),
    ] = STEP_INTERVAL_MS,
    standby: Annotated[
        bool,
        typer.Option(
            "--standby",
            envvar="EVSCHED_NODE_STANDBY",
            help="Also keep warm indexes of the partitions this node does not own (the disk "
            "and CPU of a read replica), so taking one over folds a short tail only.",
        ),
    ] = False,
    standby_partitions: Annotated[
        str | None,
        typer.Option(
            "--standby-partitions",
            help="With --standby: keep copies of these partitions only, e.g. 0,2,5-7.",
        ),
    ] = None,
    metrics_port: Annotated[int | None, metrics_port_option("EVSCHED_NODE_METRICS_PORT")] = None,
    metrics_addr: MetricsAddr = "127.0.0.1",
    log_json: LogJson = True,
) -> None:
    """Own events partitions: fold them into RocksDB and run the scheduler."""
    try:
        only = None if standby_partitions is None else parse_partitions(standby_partitions)
    except ValueError as exc:
        typer.echo(f"evsched node: --standby-partitions: {exc}", err=True)
        raise typer.Exit(2) from None
    if only is not None and not standby:
        typer.echo("evsched node: --standby-partitions needs --standby", err=True)
        raise typer.Exit(2)
    configure_logging(json=log_json)
    hide_startup_noise()  # the coordinator look-ups a new group retries (client_logs)
    dispatch_key = load_dispatch_key("node")
    node_keyring = load_node_keyring("node")
    try:
        settings = Settings.from_env()
        tick_transactions = tick_transactions_from_env()
    except SettingsError as exc:
        typer.echo(f"evsched node: {exc}", err=True)  # names the variable; no traceback
        raise typer.Exit(2) from None
    config = NodeConfig(
        settings=settings,
        node_id=node_id or socket.gethostname(),
        data_dir=data_dir,
        budgets=PlannerBudgets(
            dispatch_timeout_ms=int(dispatch_timeout_s * 1000),
            max_in_flight_per_queue=max_in_flight,
            max_unstarted_per_queue=max_unstarted,
            unstarted_horizon_ms=unstarted_horizon_ms,
            prelease_ms=prelease_ms,
        ),
        step_interval_ms=step_interval_ms,
        metrics_port=metrics_port,
        metrics_addr=metrics_addr,
        dispatch_key=dispatch_key,
        node_keyring=node_keyring,
        standby=standby,
        standby_partitions=only,
        tick_transactions=tick_transactions,
    )
    try:
        asyncio.run(serve_node(config))
    except (TopicMisconfigured, TopicRefused, BrokerAccessRefused) as exc:
        # An operator's fix, not a bug: one line naming the topic, or the TLS/SASL setting.
        typer.echo(f"evsched node: {exc}", err=True)
        raise typer.Exit(1) from None
