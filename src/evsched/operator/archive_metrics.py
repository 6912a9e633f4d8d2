"""Prometheus instruments of ``evsched archive``: how far each partition is archived, its lag."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from evsched.adapters.archive.files import ArchiveFile


class ArchiveInstruments:
    """The archiver's gauges and counters, in a registry of their own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.archived = Gauge(
            "evsched_archive_last_offset",
            "Offset of the last record in an archive file (sealed or tail), per partition.",
            ["partition"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "evsched_archive_lag_records",
            "Offsets of the events log not yet in any archive file (log end - last archived - 1).",
            ["partition"],
            registry=self.registry,
        )
        self.files = Counter(
            "evsched_archive_files",
            "Archive files written, by kind (sealed, tail).",
            ["kind"],
            registry=self.registry,
        )
        self.records = Counter(
            "evsched_archive_records",
            "Records written to archive files (a tail's records count again when it is replaced).",
            registry=self.registry,
        )

    def file_written(self, file: ArchiveFile, records: int) -> None:
        self.files.labels("tail" if file.tail else "sealed").inc()
        self.records.inc(records)
        self.archived.labels(str(file.partition)).set(file.last)

    def positions(self, archived_last: Mapping[int, int], ends: Mapping[int, int]) -> None:
        for partition, last in archived_last.items():
            self.archived.labels(str(partition)).set(last)
            if partition in ends:
                self.lag.labels(str(partition)).set(max(0, ends[partition] - last - 1))
