"""Options that several process commands share, declared once so they read the same everywhere."""

from __future__ import annotations

from typing import Annotated

import typer

# Processes log one JSON object per line by default; a terminal reads the console format better.
LogJson = Annotated[bool, typer.Option("--log-json/--log-console")]
