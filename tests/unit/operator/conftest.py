"""Fixtures of the operator command tests."""

from __future__ import annotations

import pytest
import typer

from evsched.operator import register


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    """A CLI with every operator command registered, as evsched.cli registers them."""
    app = typer.Typer()
    register(app)
    return app
