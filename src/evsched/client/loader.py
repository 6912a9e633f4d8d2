"""Finds the App a process serves from its ``module:attribute`` reference."""

from __future__ import annotations

import importlib
import os
import sys

import typer

from evsched.client.app import App


def load_app(reference: str) -> App:
    """The App at ``module:attribute`` (the current directory is importable, as with uvicorn).

    Raises ``typer.BadParameter``: every caller is a command line, which shows it as a usage error.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise typer.BadParameter(f"expected module:attribute, got {reference!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise typer.BadParameter(f"{reference} is not an evsched App")
    return app
