"""The ``evsched`` command line: one Typer app with a sub-app per area."""

from __future__ import annotations

import typer

from evsched.cli.api import api_command
from evsched.cli.dev import dev_command
from evsched.cli.kafka import kafka_app
from evsched.cli.node import node_command
from evsched.cli.relay import relay_command
from evsched.cli.worker import worker_command
from evsched.logging import configure_logging
from evsched.operator import register as register_operator_commands

app = typer.Typer(no_args_is_help=True, add_completion=False, help="evsched: event-sourced jobs.")
app.add_typer(kafka_app, name="kafka")
app.command("worker")(worker_command)
app.command("api")(api_command)
# enqueue, job, jobs, audit, cancel, requeue, dlq, schedules, export, archive, rebuild, replay
register_operator_commands(app)
app.command("node")(node_command)
app.command("dev")(dev_command)
app.command("relay")(relay_command)


def main() -> None:
    # Unconfigured, structlog prints to stdout, where a command's results go (`--json | jq`):
    # every command's log lines go to stderr. Process commands set their renderer on top.
    configure_logging()
    app()
