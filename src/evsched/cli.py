"""The ``evsched`` command line: one Typer app with a sub-app per area."""

from __future__ import annotations

import typer

from evsched.devstack.cli import kafka_app

app = typer.Typer(no_args_is_help=True, add_completion=False, help="evsched: event-sourced jobs.")
app.add_typer(kafka_app, name="kafka")


def main() -> None:
    app()
