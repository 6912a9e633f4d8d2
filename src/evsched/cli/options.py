"""Options that several process commands share, declared once so they read the same everywhere."""

from __future__ import annotations

from typing import Annotated, Any

import typer

# Processes log one JSON object per line by default; a terminal reads the console format better.
LogJson = Annotated[bool, typer.Option("--log-json/--log-console")]

# Metrics are off unless a port is given; the address defaults to loopback.
MetricsAddr = Annotated[str, typer.Option("--metrics-addr", help="Address for --metrics-port.")]


def metrics_port_option(envvar: str) -> Any:
    """``--metrics-port``, also read from ``envvar``; without it the process opens no port."""
    return typer.Option(
        "--metrics-port",
        min=1,
        max=65_535,
        envvar=envvar,
        help="Serve Prometheus metrics on this port (off by default).",
    )
