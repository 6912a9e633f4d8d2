"""Exports: records of the events log to a history file, read from Kafka or, for one job, the index.

Records go out sorted by (partition, offset), with the selection in the file's metadata and no
clock reading, so exporting the same range twice gives the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from evsched.adapters import kafka
from evsched.adapters.history_file import HistoryWriter, LoggedEvent
from evsched.adapters.topics import Topics, partition_count
from evsched.operator.replica_dir import FETCH_OPTIONS, FETCH_RECORDS, LocalIndex
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
    topic = Topics(settings.namespace).events
    count = await partition_count(settings.bootstrap, topic, **dict(settings.kafka_options))
    partitions = range(count) if selection.partition is None else [selection.partition]
    tps = [TopicPartition(topic, p) for p in partitions if 0 <= p < count]
    if not tps:
        raise ValueError(f"partition {selection.partition} is not in 0..{count - 1}")
    consumer = kafka.consumer(settings, group_id=None, client_id="evsched-export", **FETCH_OPTIONS)
    await consumer.start()
    try:
        consumer.assign(tps)
        bounds = await _bounds(consumer, tps, selection)
        total = sum(hi - lo for lo, hi in bounds.values())
        done = 0
        for tp in tps:  # one partition after the other: the file is sorted by (partition, offset)
            done = await _copy(
                consumer, tp, bounds[tp], writer, done=done, total=total, progress=progress
            )
    finally:
        await consumer.stop()
    return writer.count


async def _bounds(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], selection: LogRange
) -> dict[TopicPartition, tuple[int, int]]:
    """Per partition, [low, high) offsets to read: the selection within what the log holds."""
    firsts = await consumer.beginning_offsets(tps)
    ends = await consumer.end_offsets(tps)
    bounds: dict[TopicPartition, tuple[int, int]] = {}
    for tp in tps:
        low = max(selection.start, firsts[tp])
        high = ends[tp] if selection.end is None else min(selection.end + 1, ends[tp])
        bounds[tp] = (low, max(low, high))
    return bounds


async def _copy(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    bounds: tuple[int, int],
    writer: HistoryWriter,
    *,
    done: int,
    total: int,
    progress: Progress | None,
) -> int:
    low, high = bounds
    consumer.seek(tp, low)
    while low < high and await consumer.position(tp) < high:
        batch = await consumer.getmany(tp, timeout_ms=500, max_records=FETCH_RECORDS)
        for raw in batch.get(tp, []):
            if raw.offset < high:
                writer.write(LoggedEvent.from_record(kafka.to_record(raw)))
                done += 1
        if progress is not None:
            progress(done, total)
    return done
