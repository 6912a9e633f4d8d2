"""Errors of the local broker harness, each with a message fit to show a user as is."""

from __future__ import annotations

from evsched.errors import EvschedError


class DevstackError(EvschedError):
    """The local broker could not be prepared, started or stopped."""


class ToolMissing(DevstackError):
    """A program the harness runs (java, mvn) is not on PATH."""


class PortInUse(DevstackError):
    """A port the broker needs is already bound by another process."""

    def __init__(self, port: int) -> None:
        super().__init__(f"port {port} is in use by another process")
        self.port = port


class JarsUnavailable(DevstackError):
    """Maven could not resolve the broker's jars."""


class BrokerFailed(DevstackError):
    """The broker process exited or did not answer in time."""
