"""The in-memory twin of ``ports.JobFeed``: follows jobs in what a ``MemoryLog`` acknowledged.

A MemoryLog has one partition per topic, so every job is on partition 0; a record's log time is
what the log's acknowledgement reported (0 when it reported none).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator

from evsched.errors import EvschedError
from evsched.ports import Record
from evsched.testing.memory import MemoryLog

# A follow waits for the next append in steps of this long (the log wakes it sooner).
WAIT_STEP_S = 3_600.0


class MemoryJobFeed:
    """Follows the records of ``topic`` in ``log``, keyed by job id, from an offset on."""

    def __init__(self, log: MemoryLog, topic: str = "evsched.events") -> None:
        self.log = log
        self.topic = topic
        self.started = False
        self.following = 0  # follows open right now

    async def start(self) -> None:
        self.started = True

    async def close(self) -> None:
        self.started = False

    async def partition_of(self, job_id: str) -> int:
        return 0

    async def follow(
        self, job_id: str, partition: int, offset: int
    ) -> AsyncGenerator[Record, None]:
        if partition != 0:
            raise EvschedError(f"{self.topic} has no partition {partition}")
        key, seen = job_id.encode(), 0
        self.following += 1
        try:
            while True:
                written = [r for r in self.log.records if r.topic == self.topic]
                for record in written[seen:]:
                    if record.key == job_id and record.offset >= offset:
                        yield Record(
                            self.topic, 0, record.offset, record.log_at or 0, key, record.value
                        )
                seen = len(written)
                await self._appended_past(seen)
        finally:
            self.following -= 1

    async def _appended_past(self, seen: int) -> None:
        with contextlib.suppress(AssertionError):  # waited a step: look again
            await self.log.wait_for(
                lambda log: sum(1 for r in log.records if r.topic == self.topic) > seen,
                timeout_s=WAIT_STEP_S,
                what="a record to follow",
            )
