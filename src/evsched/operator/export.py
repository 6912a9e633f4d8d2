"""Exports: records of the events log to a history file, read from Kafka or, for one job, the index.

Records go out sorted by (partition, offset), with the selection in the file's metadata and no
clock reading, so exporting the same range twice gives the same bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from evsched.adapters.archive.history_file import HistoryWriter, LoggedEvent
from evsched.adapters.kafka.range_reader import KafkaRangeReader
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.operator.replica_dir import LocalIndex
from evsched.settings import Settings

# Called with (records exported so far, records in the selection).
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRange:
    """Offsets ``start`` through ``end`` (inclusive) of one partition, or of all of them."""

    partition: int | None = None
    start: int = 0
    end: int | None = None

    def metadata(self, namespace: str) -> dict[str, str]:
        return {
            "namespace": namespace,
            "selection": "range",
            "partition": "all" if self.partition is None else str(self.partition),
            "from": str(self.start),
            "to": "end" if self.end is None else str(self.end),
        }


def job_events(local: LocalIndex, job_id: str) -> list[LoggedEvent]:
    """A job's (or schedule's) records from the index timeline: no log scan."""
    return [
        LoggedEvent(
            partition=entry.partition,
            offset=entry.offset,
            log_at=entry.log_at,
            key=job_id.encode(),
            value=raw,
            kind=entry.kind,
        )
        for entry, raw in local.index_of(job_id).timeline_events(job_id)
    ]


async def export_range(
    settings: Settings, selection: LogRange, writer: HistoryWriter, progress: Progress | None
) -> int:
    """Write the records of ``selection`` (up to the log end seen at start); how many."""
    async for event in range_events(settings, selection, progress):
        writer.write(event)
    return writer.count


async def range_events(
    settings: Settings, selection: LogRange, progress: Progress | None = None
) -> AsyncIterator[LoggedEvent]:
    """The records of ``selection`` up to the log end seen at start, by (partition, offset).

    ``ValueError`` when the selection names a partition the log does not have.
    """
    topic = Topics(settings.namespace).events
    count = await partition_count(settings.bootstrap, topic, **dict(settings.kafka_options))
    partitions = range(count) if selection.partition is None else [selection.partition]
    wanted = [p for p in partitions if 0 <= p < count]
    if not wanted:
        raise ValueError(f"partition {selection.partition} is not in 0..{count - 1}")
    async with KafkaRangeReader(settings, topic) as reader:
        bounds = _selected(await reader.bounds(wanted), selection)
        total = sum(hi - lo for lo, hi in bounds.values())
        done = 0
        for partition in wanted:  # one after the other: the file is sorted by (partition, offset)
            low, high = bounds[partition]
            async for batch in reader.batches(partition, low, high):
                for record in batch:
                    yield LoggedEvent.from_record(record)
                done += len(batch)
                if progress is not None:
                    progress(done, total)


def _selected(held: dict[int, tuple[int, int]], selection: LogRange) -> dict[int, tuple[int, int]]:
    """Per partition, [low, high) offsets to read: the selection within what the log holds."""
    bounds: dict[int, tuple[int, int]] = {}
    for partition, (first, end) in held.items():
        low = max(selection.start, first)
        high = end if selection.end is None else min(selection.end + 1, end)
        bounds[partition] = (low, max(low, high))
    return bounds
