"""``evsched archive``: copy the events log into rolling Avro history files, running or once."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from evsched.adapters.archive.files import ArchiveError, ArchiveLock
from evsched.adapters.clock import SYSTEM_CLOCK
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.kafka.topics import Topics, partition_count
from evsched.logging import configure_logging
from evsched.metrics import serve_metrics
from evsched.operator.archive_metrics import ArchiveInstruments
from evsched.operator.archiver import Archiver, Roll
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.render import emit_json, out
from evsched.operator.session import Json, run
from evsched.settings import Settings

# An archive is throughput, not latency: large fetches, as an export's.
FETCH_OPTIONS = {"max_partition_fetch_bytes": 8 << 20, "fetch_max_bytes": 64 << 20}
# How often a running archiver reads the log end, for its lag gauge.
LAG_EVERY_S = 5.0
DEFAULT_ROLL = Roll()


def archive(
    *,
    to: Annotated[
        Path,
        typer.Option(
            "--to", envvar="EVSCHED_ARCHIVE_DIR", help="The archive directory (p0000/, ...)."
        ),
    ],
    once: Annotated[
        bool, typer.Option("--once", help="Archive up to the log end seen at start, then exit.")
    ] = False,
    roll_records: Annotated[
        int,
        typer.Option(
            "--roll-records",
            min=1,
            envvar="EVSCHED_ARCHIVE_ROLL_RECORDS",
            help="Seal a file once it holds this many records.",
        ),
    ] = DEFAULT_ROLL.records,
    roll_bytes: Annotated[
        int,
        typer.Option(
            "--roll-bytes",
            min=1,
            envvar="EVSCHED_ARCHIVE_ROLL_BYTES",
            help="Seal a file once its keys and values add up to this many bytes.",
        ),
    ] = DEFAULT_ROLL.payload_bytes,
    tail_s: Annotated[
        float,
        typer.Option(
            "--tail-s",
            min=0.1,
            envvar="EVSCHED_ARCHIVE_TAIL_S",
            help="Write records not yet in a sealed file to a tail file after this long.",
        ),
    ] = DEFAULT_ROLL.tail_s,
    accept_gap: Annotated[
        bool,
        typer.Option(
            "--accept-gap",
            help="Go on from the log start when retention deleted offsets not yet archived.",
        ),
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=1,
            max=65_535,
            envvar="EVSCHED_ARCHIVE_METRICS_PORT",
            help="Serve Prometheus metrics on this port (off by default).",
        ),
    ] = None,
    metrics_addr: Annotated[
        str, typer.Option("--metrics-addr", help="Address for --metrics-port.")
    ] = "127.0.0.1",
    log_json: Annotated[bool, typer.Option("--log-json/--log-console")] = True,
    as_json: Json = False,
) -> None:
    """Copy the events log into per-partition Avro files named by their offset ranges.

    Files roll by record count and size, so the same records always make the same files;
    a restart (after a crash too) continues after the last file, without gap or duplicate.
    """
    configure_logging(json=log_json)
    roll = Roll(records=roll_records, payload_bytes=roll_bytes, tail_s=tail_s)
    instruments = None if metrics_port is None else ArchiveInstruments()
    if instruments is not None and metrics_port is not None:
        serve_metrics(instruments.registry, metrics_port, metrics_addr)

    async def main() -> None:
        settings = Settings.from_env()
        topic = Topics(settings.namespace).events
        count = await partition_count(settings.bootstrap, topic, **dict(settings.kafka_options))
        partitions = range(count)
        log = KafkaPartitionLog(
            settings, topic, partitions, client_id="evsched-archive", **FETCH_OPTIONS
        )
        archiver = Archiver(
            log,
            to,
            namespace=settings.namespace,
            partitions=partitions,
            clock=SYSTEM_CLOCK,
            roll=roll,
            on_file=None if instruments is None else instruments.file_written,
        )
        lock = _lock(to)
        try:
            async with log:
                resumed = await _open(archiver, accept_gap)
                try:
                    await _archive(archiver, log, once=once, instruments=instruments)
                except BaseException:
                    archiver.abandon()
                    raise
        finally:
            lock.release()
        _report(archiver, resumed, as_json)

    run(main)


def _lock(root: Path) -> ArchiveLock:
    try:
        return ArchiveLock(root)
    except ArchiveError as exc:
        raise OperatorError(ExitCode.FAILED, str(exc)) from None


async def _open(archiver: Archiver, accept_gap: bool) -> dict[int, int]:
    try:
        return await archiver.open(accept_gap=accept_gap)
    except ArchiveError as exc:
        raise OperatorError(ExitCode.FAILED, str(exc)) from None


async def _archive(
    archiver: Archiver,
    log: KafkaPartitionLog,
    *,
    once: bool,
    instruments: ArchiveInstruments | None,
) -> None:
    if once:
        await archiver.run_to(await log.end_offsets(archiver.partitions))
        return
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    last = -LAG_EVERY_S

    async def between() -> None:
        nonlocal last
        now = SYSTEM_CLOCK.monotonic_s()
        if instruments is not None and now - last >= LAG_EVERY_S:
            last = now
            ends = await log.end_offsets(archiver.partitions)
            instruments.positions(archiver.state.archived_last, ends)

    try:
        await archiver.run(stop, between=between)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _report(archiver: Archiver, resumed: dict[int, int], as_json: bool) -> None:
    written = archiver.state.files
    rows: list[dict[str, Any]] = [
        {
            "partition": p,
            "resumed_at": resumed[p],
            "archived_last": archiver.state.archived_last.get(p, -1),
            "files": [f.path.name for f in written if f.partition == p],
        }
        for p in archiver.partitions
    ]
    if as_json:
        emit_json({"archive": str(archiver.root), "partitions": rows})
        return
    for row in rows:
        out.print(
            f"p{row['partition']}: resumed at {row['resumed_at']}, archived through "
            f"{row['archived_last']}, {len(row['files'])} files written"
        )
