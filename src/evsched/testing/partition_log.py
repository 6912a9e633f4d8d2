"""The in-memory twin of ``ports.PartitionLog``: records, markers and a start retention trimmed.

Behaves as a read_committed Kafka reader does where the restore path relies on it: offsets
are dense and taken by records and transaction markers (or aborted records) alike, markers are
never returned but move the position, a seek below the log's start reads from its start, and
reads return records in offset order. ``fail_next`` makes the next call raise
``BrokerUnavailable``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from evsched.errors import BrokerUnavailable
from evsched.ports import Record


class MemoryPartitionLog:
    """Partitions of one topic held in memory; ``append``/``mark`` add to them, ``trim`` cuts."""

    def __init__(self, topic: str = "ns.events", partitions: int = 1) -> None:
        self.topic = topic
        # Per partition, per offset: the record, or None for a marker (never returned).
        self.entries: dict[int, list[Record | None]] = {p: [] for p in range(partitions)}
        self.first: dict[int, int] = dict.fromkeys(range(partitions), 0)
        self.positions: dict[int, int] = {}
        self.started = False
        self.fail_next = False
        self._appended = asyncio.Event()

    # --- writing, as a test does ---------------------------------------------------------------

    def append(
        self, partition: int, value: bytes | None, *, key: bytes | None = None, log_at: int = 0
    ) -> Record:
        offset = len(self.entries[partition])
        record = Record(self.topic, partition, offset, log_at, key, value)
        self.entries[partition].append(record)
        self._appended.set()
        return record

    def mark(self, partition: int, count: int = 1) -> None:
        """Offsets taken by transaction markers or aborted records: read past, never returned."""
        self.entries[partition].extend([None] * count)
        self._appended.set()

    def trim(self, partition: int, start: int) -> None:
        """Retention deleted everything below ``start``."""
        self.first[partition] = start

    # --- ports.PartitionLog ----------------------------------------------------------------------

    async def start(self) -> None:
        self._check()
        self.started = True

    async def close(self) -> None:
        self.started = False

    def seek(self, partition: int, offset: int) -> None:
        self._check()
        self.positions[partition] = offset

    async def position(self, partition: int) -> int:
        self._check()
        return max(self.positions.get(partition, 0), self.first[partition])

    async def start_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        self._check()
        return {p: self.first[p] for p in partitions}

    async def end_offsets(self, partitions: Collection[int]) -> dict[int, int]:
        self._check()
        return {p: len(self.entries[p]) for p in partitions}

    async def read(
        self, partitions: Collection[int], timeout_s: float, max_records: int
    ) -> dict[int, list[Record]]:
        self._check()
        wanted = list(partitions) or list(self.entries)
        if timeout_s > 0 and not self._readable(wanted):
            self._appended.clear()
            try:
                await asyncio.wait_for(self._appended.wait(), timeout_s)
            except TimeoutError:
                return {}
        else:
            await asyncio.sleep(0)  # a read always yields, as a fetch does
        return self._take(wanted, max_records)

    def _readable(self, partitions: list[int]) -> bool:
        return any(self._position(p) < len(self.entries[p]) for p in partitions)

    def _position(self, partition: int) -> int:
        return max(self.positions.get(partition, 0), self.first[partition])

    def _take(self, partitions: list[int], max_records: int) -> dict[int, list[Record]]:
        batches: dict[int, list[Record]] = {}
        budget = max_records
        for partition in partitions:
            entries, position = self.entries[partition], self._position(partition)
            records: list[Record] = []
            while position < len(entries) and budget > 0:
                entry = entries[position]
                position += 1
                if entry is not None:
                    records.append(entry)
                    budget -= 1
            self.positions[partition] = position
            if records:
                batches[partition] = records
        return batches

    def _check(self) -> None:
        if self.fail_next:
            self.fail_next = False
            raise BrokerUnavailable("the memory log was told to fail")
