"""The runtime's clock: wall time in epoch milliseconds and a monotonic clock for deadlines."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (UTC)."""
    return time.time_ns() // 1_000_000


def monotonic_s() -> float:
    """Seconds on a clock that never jumps, for timeouts and deadlines."""
    return time.monotonic()


class SystemClock:
    """The machine's clocks, as a :class:`Clock`."""

    def now_ms(self) -> int:
        return now_ms()

    def monotonic_s(self) -> float:
        return monotonic_s()


SYSTEM_CLOCK = SystemClock()
