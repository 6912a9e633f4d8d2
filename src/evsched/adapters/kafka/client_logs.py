"""The Kafka client's own log lines: which of them are start-up noise, hidden until a group forms.

A broker answers a consumer group's first look-up of its coordinator with "not available" while it
creates ``__consumer_offsets`` (a fresh broker) or loads the group's offsets (a restarted one).
aiokafka retries by itself, but logs each answer at ERROR ("Group Coordinator Request failed:
[Error 15] GroupCoordinatorNotAvailableError"), so every process of a new stack opened with an
error that was none. Those answers, and only those, are hidden from a process's start until its
first group has joined or ``START_UP_S`` has passed, whichever comes first: a coordinator that
stays away longer, or goes away later, is reported as before, and so is every other line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiokafka import errors

from evsched.adapters.clock import monotonic_s

# aiokafka's module that looks the coordinator up and logs its failures.
COORDINATOR_LOGGER = "aiokafka.consumer.group_coordinator"
# The answers of a coordinator that is still being set up: retriable, retried by the client.
TRANSIENT: tuple[type[errors.KafkaError], ...] = (
    errors.GroupCoordinatorNotAvailableError,
    errors.NotCoordinatorForGroupError,
    errors.GroupLoadInProgressError,
)
# Longer than a loaded 2-core machine takes to create __consumer_offsets and join a group.
START_UP_S = 60.0


class StartupNoise(logging.Filter):
    """Drops the transient coordinator answers logged before the start-up is over."""

    def __init__(
        self, *, start_up_s: float = START_UP_S, clock: Callable[[], float] = monotonic_s
    ) -> None:
        super().__init__()
        self._clock = clock
        self._until = clock() + start_up_s
        self.over = False

    def joined(self) -> None:
        """A group of this process has joined: from now on a coordinator error is news."""
        self.over = True

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.over and self._clock() >= self._until:
            self.over = True
        if self.over:
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(arg, TRANSIENT) for arg in args)


_noise: StartupNoise | None = None


def hide_startup_noise(*, start_up_s: float = START_UP_S) -> StartupNoise:
    """Hide the client's transient coordinator errors of this process's start-up (once)."""
    global _noise  # noqa: PLW0603 — one filter for the process's one logger
    logger = logging.getLogger(COORDINATOR_LOGGER)
    if _noise is not None:
        logger.removeFilter(_noise)
    _noise = StartupNoise(start_up_s=start_up_s)
    logger.addFilter(_noise)
    return _noise


def group_joined() -> None:
    """Called when a consumer group of this process has joined: the start-up is over."""
    if _noise is not None:
        _noise.joined()
