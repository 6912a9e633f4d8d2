"""structlog setup: JSON lines with stable snake_case event names, or a console view."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog
from rich.console import Console


def configure_logging(*, json: bool = True, level: int | None = None) -> None:
    """Route structlog (and the stdlib loggers of our dependencies) to stderr.

    ``level`` defaults to ``EVSCHED_LOG_LEVEL`` (debug, info, warning, error), else info.
    """
    if level is None:
        name = os.environ.get("EVSCHED_LOG_LEVEL", "info").upper()
        level = logging.getLevelNamesMapping().get(name, logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=colour_wanted(sys.stderr))
    )
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            stamp,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    _route_stdlib(renderer, stamp)


def colour_wanted(stream: TextIO) -> bool:
    """Whether ``stream`` takes colour: a terminal (or ``FORCE_COLOR``), and no ``NO_COLOR``.

    rich's rules (no-color.org, force-color.org, ``TERM=dumb``), so a console log written to a
    file or a pipe holds no escape codes unless asked for.
    """
    console = Console(file=stream)
    return console.color_system is not None and not console.no_color


class _StdlibHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The root logger's handler from configure_logging (replaced, not doubled, on a repeat)."""


def _route_stdlib(renderer: structlog.typing.Processor, stamp: structlog.typing.Processor) -> None:
    # Our dependencies' warnings (aiokafka's produce retries, uvicorn's) in the same lines as our
    # own: JSON with a timestamp, the level and the logger's name, so they can be lined up with
    # the rest when reading a stall back. Handlers that others put on the root logger stay.
    handler = _StdlibHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                stamp,
                structlog.processors.format_exc_info,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StdlibHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
