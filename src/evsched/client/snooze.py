"""Snooze: what a handler returns or raises to run its job again later without spending an attempt.

The worker reports it as an AttemptSnoozed under the attempt's token; the fold puts the job back
to scheduled at log time + the delay (core.snooze). A task allows ``max_snoozes`` snoozes of one
job (``App.task``, default ``DEFAULT_MAX_SNOOZES``); a snooze past them is a failed attempt of
category ``snooze_limit``.
"""

from __future__ import annotations

import math
from datetime import timedelta

from evsched.core.bounds import MAX_SNOOZE_MS, MAX_SNOOZE_REASON_BYTES, MAX_SNOOZES
from evsched.errors import InvalidTask

# Like Sidekiq's and River's retry budgets, a limit that stops a job that snoozes for ever
# without one snooze-happy handler failing at once; a task may set its own, 0 to MAX_SNOOZES.
DEFAULT_MAX_SNOOZES = 25


class Snooze(Exception):
    """Run this job again in ``seconds`` (a number or a timedelta, up to 30 days), spending no
    attempt: ``return Snooze(30)`` or ``raise Snooze(30, reason="upstream said 429")``.

    ValueError for a negative, non-finite or too long delay; a reason longer than 1024 UTF-8
    bytes is cut to them (it is a line in the job's timeline).
    """

    def __init__(self, seconds: float | timedelta, reason: str = "") -> None:
        total = seconds.total_seconds() if isinstance(seconds, timedelta) else seconds
        if (
            isinstance(total, bool)
            or not isinstance(total, int | float)
            or not math.isfinite(total)
        ):
            raise ValueError(f"Snooze seconds must be a finite number, not {seconds!r}")
        delay_ms = math.ceil(total * 1000)
        if not 0 <= delay_ms <= MAX_SNOOZE_MS:
            raise ValueError(f"Snooze seconds {total} is outside [0, {MAX_SNOOZE_MS // 1000}]")
        if not isinstance(reason, str):
            raise ValueError(f"Snooze reason must be a string, not {reason!r}")
        reason = reason.encode()[:MAX_SNOOZE_REASON_BYTES].decode(errors="ignore")
        super().__init__(f"snooze for {delay_ms} ms" + (f": {reason}" if reason else ""))
        self.delay_ms = delay_ms
        self.reason = reason


def checked_max_snoozes(value: int) -> int:
    """``value`` as a task's cap on snoozes, InvalidTask outside 0..MAX_SNOOZES."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SNOOZES:
        raise InvalidTask("max_snoozes", f"{value!r} is not an integer in [0, {MAX_SNOOZES}]")
    return value
