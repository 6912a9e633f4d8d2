"""The operator's command line: reads from a caught-up local replica, writes, audits, exports,
rebuilds and replays; ``register`` adds its commands to the ``evsched`` app."""

from __future__ import annotations

from evsched.operator.commands import EXIT_CODES_HELP, register

__all__ = ["EXIT_CODES_HELP", "register"]
