"""Exit codes of the operator commands, and the error that carries one out to the command line."""

from __future__ import annotations

import enum

from evsched.errors import EvschedError


class ExitCode(enum.IntEnum):
    """What an operator command's exit status means; scripts may rely on these numbers."""

    OK = 0
    # A check said no: a replay diverged, a rebuilt digest differs from the live one.
    FAILED = 1
    # Bad arguments; typer (click) uses 2 for its own usage errors too.
    USAGE = 2
    # The job, schedule or file named does not exist (in the caught-up replica, or on disk).
    NOT_FOUND = 3
    # Kafka or the local index could not be reached, read or written in time.
    UNAVAILABLE = 4
    # A write was acknowledged by the broker, but the fold did not apply it (rejected, stale,
    # conflict); the verdict and its reason are printed. Also a write left unwritten because
    # the fold would refuse it: a backfill of a paused schedule.
    REFUSED = 5
    # A fault of evsched's own (a bug, or a record it could not handle): one line on stderr;
    # EVSCHED_DEBUG=1 lets the traceback through. 70 is sysexits' EX_SOFTWARE.
    INTERNAL = 70


class OperatorError(EvschedError):
    """Ends a command with ``code`` after printing ``message`` to stderr."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
