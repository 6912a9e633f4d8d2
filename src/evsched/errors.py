"""evsched's own exceptions, so that third-party errors stop at the adapter that met them."""

from __future__ import annotations


class EvschedError(Exception):
    """Base of every error evsched raises on purpose."""


class ContractError(EvschedError):
    """The packaged Avro schemas are missing, unreadable or disagree with each other."""


class DecodeError(EvschedError):
    """Bytes that are not a valid evsched record; ``reason`` says why, in one line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class EncodeError(EvschedError):
    """A value that cannot be written under its schema (e.g. an int beyond 64 bits)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

