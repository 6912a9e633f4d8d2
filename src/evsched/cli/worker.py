"""``evsched worker``: serve an App's tasks from its dispatch queues."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Annotated

import structlog
import typer

from evsched.adapters.kafka.client_logs import hide_startup_noise
from evsched.adapters.kafka.dispatch_feed import START_LOOKBACK_MS
from evsched.adapters.proofs import KEY_ENV as NODE_KEY_ENV
from evsched.adapters.proofs import KEY_FILE_ENV as NODE_KEY_FILE_ENV
from evsched.adapters.proofs import NodeKeyring, node_keyring_from_env
from evsched.adapters.signing import TRUE_VALUES, UNSIGNED_ENV, DispatchKey, dispatch_key_from_env
from evsched.cli.options import LogJson, MetricsAddr, metrics_port_option
from evsched.client.loader import load_app
from evsched.errors import EvschedError
from evsched.logging import configure_logging
from evsched.metrics import WorkerInstruments, serve_metrics
from evsched.runtime.process.allocator import tune_allocator
from evsched.runtime.process.gc_policy import tune_collector
from evsched.runtime.worker.main import kafka_worker, serve_when_reachable
from evsched.runtime.worker.worker import WorkerConfig
from evsched.settings import SettingsError

log = structlog.get_logger("evsched.worker")


def worker_command(
    *,
    app: Annotated[str, typer.Option(help="The App to serve, as module:attribute.")],
    queues: Annotated[
        str | None, typer.Option(help="Comma-separated queues; default: those of the app's tasks.")
    ] = None,
    pool: Annotated[str, typer.Option(help="Worker pool: consumer group <ns>.workers.<pool>.")] = (
        "default"
    ),
    concurrency: Annotated[int, typer.Option(min=1, help="Attempts run at once.")] = 10,
    lease_s: Annotated[
        float, typer.Option(min=0.01, help="Run lease, renewed every third of it.")
    ] = 30.0,
    grace_s: Annotated[
        float, typer.Option(min=0, help="On SIGTERM, how long running attempts may finish.")
    ] = 30.0,
    start_lookback_s: Annotated[
        float,
        typer.Option(
            min=0, help="A pool new to a dispatch partition starts at its records of this long ago."
        ),
    ] = START_LOOKBACK_MS / 1000,
    metrics_port: Annotated[int | None, metrics_port_option("EVSCHED_WORKER_METRICS_PORT")] = None,
    metrics_addr: MetricsAddr = "127.0.0.1",
    log_json: LogJson = True,
) -> None:
    """Run the tasks of an evsched App from its dispatch queues."""
    configure_logging(json=log_json)
    hide_startup_noise()  # the coordinator look-ups a new group retries (client_logs)
    try:
        loaded = load_app(app)  # an App made at import reads its settings from the environment
    except SettingsError as exc:
        typer.echo(f"evsched worker: {exc}", err=True)  # names the variable; no traceback
        raise typer.Exit(2) from None
    listed = tuple(q.strip() for q in (queues or "").split(",") if q.strip())
    config = WorkerConfig(
        queues=listed or loaded.queues,
        pool=pool,
        concurrency=concurrency,
        lease_ms=round(lease_s * 1000),
        grace_s=grace_s,
        start_lookback_ms=round(start_lookback_s * 1000),
    )
    dispatch_key = load_dispatch_key("worker")
    instruments = None
    if metrics_port is not None:
        instruments = WorkerInstruments()
        serve_metrics(instruments.registry, metrics_port, metrics_addr)
    worker = kafka_worker(loaded, config, instruments, dispatch_key)
    tune_collector()  # after the app's imports: those are frozen with evsched's own
    tune_allocator()
    try:
        asyncio.run(serve_when_reachable(worker))
    except EvschedError as exc:  # a misconfigured topic, or the consumer that could not start
        typer.echo(f"evsched worker: {exc}", err=True)
        raise typer.Exit(1) from exc
    if worker.lingering:
        # Threads can't be killed, and Python waits for them at exit; an async handler that
        # ignored cancellation would hold the process as well: leave without them.
        log.warning("worker_exit_abandoning_handlers", handlers=worker.lingering)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def load_node_keyring(process: str) -> NodeKeyring | None:
    """The node keys from the environment, or exit 2 with one line saying what is missing.

    A node needs them (its facts carry their proof, docs/security.md) unless the same explicit
    opt-out as unsigned dispatch records is set; the API and the command line take them when
    given, to judge proofs as the nodes do.
    """
    try:
        keyring = node_keyring_from_env()
    except EvschedError as exc:
        typer.echo(f"evsched {process}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if keyring is None and process == "node":
        if os.environ.get(UNSIGNED_ENV, "").strip().lower() not in TRUE_VALUES:
            typer.echo(
                f"evsched node: no node key: set {NODE_KEY_FILE_ENV} or {NODE_KEY_ENV} "
                f"(docs/security.md), or {UNSIGNED_ENV}=1 to run without proofs",
                err=True,
            )
            raise typer.Exit(2)
        log.warning("node_unproven", process=process, reason=f"{UNSIGNED_ENV} is set")
    return keyring


def load_dispatch_key(process: str) -> DispatchKey | None:
    """The dispatch key from the environment, or exit 2 with one line saying what is missing."""
    try:
        key = dispatch_key_from_env()
    except EvschedError as exc:
        typer.echo(f"evsched {process}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if key is None:
        log.warning("dispatch_unsigned", process=process, reason=f"{UNSIGNED_ENV} is set")
    return key
