"""The worker's estimate of the log's clock: how far the broker's append time runs from its own.

A pre-leased job starts at its run_at by the LOG's clock (the fold refuses an earlier start), but
the worker waits on its own clock. Every append the worker makes comes back with the broker's
log append time, so ``log_at - sent_at`` over recent appends bounds the offset plus the trip to
the broker; the smallest recent sample is the best estimate (the shortest trip).
"""

from __future__ import annotations

from collections import deque

# Recent samples only: clocks drift, and NTP steps them.
SAMPLES = 64
# A sample further off than this is a stalled send (a frozen process, a broker pause), not a clock.
MAX_OFFSET_MS = 5_000


class LogClock:
    """``offset_ms``: add it to the worker's clock to read the log's (0 until measured)."""

    def __init__(self) -> None:
        self._samples: deque[int] = deque(maxlen=SAMPLES)

    def observe(self, *, sent_at: int, log_at: int) -> None:
        sample = log_at - sent_at
        if abs(sample) <= MAX_OFFSET_MS:
            self._samples.append(sample)

    @property
    def offset_ms(self) -> int:
        return min(self._samples, default=0)

    def log_now(self, local_ms: int) -> int:
        """The log's clock now, as near as the samples tell."""
        return local_ms + self.offset_ms
