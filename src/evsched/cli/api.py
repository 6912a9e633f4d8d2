"""``evsched api``: serve the HTTP API with uvicorn, over a read replica in ``--data-dir``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import structlog
import typer
import uvicorn

from evsched.adapters.kafka.access import check_access
from evsched.adapters.kafka.event_log_choice import event_log_factory
from evsched.api.app import create_app
from evsched.api.auth import AuthConfigError, load_tokens
from evsched.api.dashboard import StreamCaps
from evsched.cli.options import LogJson
from evsched.cli.worker import load_node_keyring
from evsched.client.loader import load_app
from evsched.errors import BrokerAccessRefused
from evsched.logging import configure_logging
from evsched.metrics import Metrics
from evsched.runtime.process.allocator import tune_allocator
from evsched.runtime.process.gc_policy import tune_collector
from evsched.runtime.replica import Replica
from evsched.settings import Settings, SettingsError

log = structlog.get_logger("evsched.api")


def api_command(
    *,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65_535, help="Port to listen on.")] = 8080,
    data_dir: Annotated[
        Path,
        typer.Option("--data-dir", envvar="EVSCHED_API_DATA_DIR", help="The replica's indexes."),
    ] = Path("./evsched-data/api"),
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            envvar="EVSCHED_API_TOKEN_FILE",
            help="A file holding the write token (or set EVSCHED_API_TOKEN). Required unless "
            "--no-auth.",
        ),
    ] = None,
    read_token_file: Annotated[
        Path | None,
        typer.Option(
            "--read-token-file",
            envvar="EVSCHED_API_READ_TOKEN_FILE",
            help="A file holding a read-only token (or set EVSCHED_API_READ_TOKEN); reads then "
            "need it or the write token.",
        ),
    ] = None,
    auth_reads: Annotated[
        bool,
        typer.Option(
            "--auth-reads", envvar="EVSCHED_API_AUTH_READS", help="Reads need a token too."
        ),
    ] = False,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth",
            envvar="EVSCHED_API_NO_AUTH",
            help="Serve without any authentication (local development only).",
        ),
    ] = False,
    app: Annotated[
        str | None,
        typer.Option(
            "--app",
            help="An App (module:attribute) whose tasks lend enqueues their defaults and checks.",
        ),
    ] = None,
    wait_timeout_s: Annotated[
        float,
        typer.Option(min=0.1, help="How long a write waits for the replica before a 202."),
    ] = 10.0,
    ready_max_lag: Annotated[
        int, typer.Option(min=0, help="/readyz fails when the replica is further behind.")
    ] = 1_000,
    max_body_bytes: Annotated[
        int, typer.Option(min=1_024, help="Larger request bodies get a 413.")
    ] = 1 << 20,
    max_scan: Annotated[
        int, typer.Option(min=1, help="Jobs a filtered listing may read per page (~14 us each).")
    ] = 5_000,
    max_live_streams: Annotated[
        int, typer.Option(min=0, help="Dashboard /live streams open at once; more get a 503.")
    ] = StreamCaps().total,
    max_anonymous_live_streams: Annotated[
        int,
        typer.Option(
            min=0,
            help="Of those, streams of callers who sent no token (all of them with --no-auth).",
        ),
    ] = StreamCaps().anonymous,
    log_json: LogJson = True,
) -> None:
    """Serve the HTTP API: enqueue, inspect, cancel, requeue, schedules, stats and metrics."""
    configure_logging(json=log_json)
    try:
        tokens = load_tokens(
            os.environ,
            token_file=token_file,
            read_token_file=read_token_file,
            auth_reads=auth_reads,
            no_auth=no_auth,
        )
    except AuthConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if max_anonymous_live_streams > max_live_streams:
        typer.echo("error: --max-anonymous-live-streams exceeds --max-live-streams", err=True)
        raise typer.Exit(2)
    if no_auth:
        log.warning("api_auth_disabled", reason="--no-auth: anyone who reaches the port may write")
    keyring = load_node_keyring("api")  # once: every partition's proofs are checked with it
    try:
        client = load_app(app) if app is not None else None
        settings = client.settings if client is not None else Settings.from_env()
        # EVSCHED_KAFKA_CLIENT and the options it must translate: refused here, not in a traceback.
        event_log_factory(settings, client_id="evsched-api")
    except SettingsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        # The replica starts inside uvicorn's lifespan, where a refusal would be a traceback.
        asyncio.run(check_access(settings.bootstrap, **dict(settings.kafka_options)))
    except BrokerAccessRefused as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    metrics = Metrics()
    replica = Replica(
        settings,
        data_dir,
        client_id="evsched-api",
        on_commit=metrics.observe_commit,
        keyring=keyring,
    )
    api = create_app(
        settings,
        replica=replica,
        app=client,
        tokens=tokens,
        metrics=metrics,
        start_replica=True,
        close_app=True,
        wait_timeout_s=wait_timeout_s,
        ready_max_lag=ready_max_lag,
        max_body_bytes=max_body_bytes,
        max_scan=max_scan,
        live_streams=StreamCaps(total=max_live_streams, anonymous=max_anonymous_live_streams),
    )
    tune_collector()
    tune_allocator()
    log.info("api_listening", host=host, port=port, data_dir=str(data_dir))
    # Open live streams (the dashboard's) must not hold a shutdown up for long.
    uvicorn.run(
        api,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
    )
