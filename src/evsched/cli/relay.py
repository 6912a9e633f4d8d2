"""``evsched relay --dsn``: move committed outbox rows to the events topic (``evsched.outbox``)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from evsched.cli.options import LogJson, MetricsAddr, metrics_port_option
from evsched.logging import configure_logging
from evsched.operator.commands.outbox import EXTRA_HINT, Dsn, Table
from evsched.settings import Settings, SettingsError


def relay_command(
    *,
    dsn: Dsn,
    table: Table = "evsched_outbox",
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, max=10_000, help="Rows per send to Kafka.")
    ] = 500,
    poll_s: Annotated[
        float,
        typer.Option(
            "--poll-s",
            min=0.01,
            max=3600,
            help="Look for rows this often without a notification; standbys try the lock so.",
        ),
    ] = 1.0,
    metrics_port: Annotated[int | None, metrics_port_option("EVSCHED_RELAY_METRICS_PORT")] = None,
    metrics_addr: MetricsAddr = "127.0.0.1",
    log_json: LogJson = True,
) -> None:
    """Relay the outbox table's committed rows to the events topic, in order, exactly once.

    Run several for availability: one relays (it holds the table's advisory lock), the others
    stand by and take over when it stops.
    """
    configure_logging(json=log_json)
    try:
        from evsched.outbox.main import serve_relay  # noqa: PLC0415
        from evsched.outbox.relay import RelayConfig  # noqa: PLC0415
        from evsched.outbox.table import InvalidTable, checked_table  # noqa: PLC0415
    except ImportError as exc:
        typer.echo(f"evsched relay: {EXTRA_HINT} ({exc})", err=True)
        raise typer.Exit(2) from None
    try:
        settings = Settings.from_env()
        checked_table(table)
    except (SettingsError, InvalidTable) as exc:
        typer.echo(f"evsched relay: {exc}", err=True)
        raise typer.Exit(2) from None
    config = RelayConfig(dsn=dsn, table=table, batch_size=batch_size, poll_s=poll_s)
    asyncio.run(serve_relay(config, settings, metrics_port=metrics_port, metrics_addr=metrics_addr))
