"""structlog setup: JSON lines with stable snake_case event names, or a console view."""

from __future__ import annotations

import logging
import os
import sys

import structlog


def configure_logging(*, json: bool = True, level: int | None = None) -> None:
    """Route structlog (and the stdlib loggers of our dependencies) to stderr.

    ``level`` defaults to ``EVSCHED_LOG_LEVEL`` (debug, info, warning, error), else info.
    """
    if level is None:
        name = os.environ.get("EVSCHED_LOG_LEVEL", "info").upper()
        level = logging.getLevelNamesMapping().get(name, logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
