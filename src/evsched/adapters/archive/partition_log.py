"""``ports.PartitionLog`` over an archive directory: its files read as the events topic would be.

Offsets no file holds (transaction markers, aborted records) are skipped as a read_committed
reader skips them; a partition ends after the last record of its newest file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterator
from pathlib import Path

from evsched.adapters.archive.files import covering, listed, partition_events
from evsched.adapters.archive.history_file import LoggedEvent
from evsched.adapters.proofs import PROOF_HEADER
from evsched.ports import Record


class ArchivePartitionLog:
    """Reads partitions of the archive at ``root`` as records of ``topic``."""

    def __init__(self, root: Path, topic: str) -> None:
        self.root = root
        self.topic = topic
        self._readers: dict[int, Iterator[LoggedEvent]] = {}
        self._next: dict[int, LoggedEvent | None] = {}
        self._bounds: dict[int, tuple[int, int]] = {}

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self._readers.clear()
        self._next.clear()

    def bounds(self, partition: int) -> tuple[int, int]:
        """The first offset the archive holds and the end after its last record; (0, 0): none."""
        if partition not in self._bounds:
            files = covering(listed(self.root, partition))
            self._bounds[partition] = (files[0].first, files[-1].last + 1) if files else (0, 0)
        return self._bounds[partition]

    def seek(self, partition: int, offset: int) -> None:
        self._readers[partition] = partition_events(self.root, partition, offset)
        self._next.pop(partition, None)

    async def position(self, partition: int) -> int:
        head = self._peek(partition)
        return self.bounds(partition)[1] if head is None else head.offset

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return {p: self.bounds(p)[0] for p in partitions}

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        return {p: self.bounds(p)[1] for p in partitions}

    async def read(
        self, partitions: Collection[int], timeout_s: float, max_records: int
    ) -> dict[int, list[Record]]:
        await asyncio.sleep(0)  # files hold no more than they hold: never waits, always yields
        batches: dict[int, list[Record]] = {}
        budget = max_records
        for partition in partitions:
            records: list[Record] = []
            while budget > 0 and (event := self._take(partition)) is not None:
                records.append(self._record(event))
                budget -= 1
            if records:
                batches[partition] = records
        return batches

    def _peek(self, partition: int) -> LoggedEvent | None:
        if partition not in self._next:
            if partition not in self._readers:
                self.seek(partition, 0)
            self._next[partition] = next(self._readers[partition], None)
        return self._next[partition]

    def _take(self, partition: int) -> LoggedEvent | None:
        event = self._peek(partition)
        if event is not None:
            del self._next[partition]
        return event

    def _record(self, event: LoggedEvent) -> Record:
        headers = () if event.proof is None else ((PROOF_HEADER, event.proof),)
        return Record(
            self.topic, event.partition, event.offset, event.log_at, event.key, event.value, headers
        )
