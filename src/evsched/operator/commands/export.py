"""``evsched export``: a job's events (from the index) or a log range (from Kafka) to a file."""

from __future__ import annotations

import enum
import hashlib
import os
from pathlib import Path
from typing import Annotated, BinaryIO

import typer

from evsched.adapters.archive.history_file import HistoryWriter
from evsched.operator.exits import ExitCode, OperatorError
from evsched.operator.export import LogRange, export_range, job_events
from evsched.operator.render import emit_json, out
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    Offline,
    ReplicaOptions,
    TimeoutS,
    progress_bar,
    replica,
    run,
)
from evsched.settings import Settings


class Codec(enum.StrEnum):
    DEFLATE = "deflate"
    NULL = "null"


def check_selection(
    job_id: str | None, partition: int | None, start: int | None, end: int | None
) -> LogRange | None:
    """The log range asked for, None for a job export; BadParameter for a mixed selection."""
    if job_id is not None:
        if partition is not None or start is not None or end is not None:
            raise typer.BadParameter(
                "--job exports one job; it takes no --partition, --from or --to",
                param_hint="--job",
            )
        return None
    if partition is None and (start is not None or end is not None):
        raise typer.BadParameter(
            "offsets belong to one partition: add --partition", param_hint="--from/--to"
        )
    if start is not None and end is not None and end < start:
        raise typer.BadParameter(f"--to {end} is before --from {start}", param_hint="--to")
    return LogRange(partition=partition, start=start or 0, end=end)


def export(
    *,
    output: Annotated[Path, typer.Option("-o", "--output", help="The history file to write.")],
    job_id: Annotated[
        str | None, typer.Option("--job", help="Only this job's events, from the index.")
    ] = None,
    partition: Annotated[int | None, typer.Option("--partition", min=0)] = None,
    start: Annotated[int | None, typer.Option("--from", min=0, help="First offset.")] = None,
    end: Annotated[int | None, typer.Option("--to", min=0, help="Last offset (inclusive).")] = None,
    codec: Annotated[Codec, typer.Option("--codec", help="Block compression.")] = Codec.DEFLATE,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """Export events with partition, offset, log time and bytes to an Avro container file.

    The same selection exported twice gives byte-identical files.
    """
    selection = check_selection(job_id, partition, start, end)
    options = ReplicaOptions(data_dir=data_dir, offline=offline, timeout_s=timeout_s, quiet=as_json)
    partial = output.with_name(f".{output.name}.partial")

    async def main() -> None:
        with partial.open("wb") as stream:
            if selection is None:
                assert job_id is not None
                count = await _export_job(options, job_id, stream, codec)
            else:
                count = await _export_range(selection, stream, codec, quiet=as_json)
        os.replace(partial, output)
        _report(output, count, as_json)

    try:
        run(main)
    finally:
        partial.unlink(missing_ok=True)


async def _export_job(options: ReplicaOptions, job_id: str, stream: BinaryIO, codec: Codec) -> int:
    async with replica(options) as local:
        events = job_events(local, job_id)
    if not events:
        raise OperatorError(ExitCode.NOT_FOUND, f"no events of {job_id!r} in the replica")
    namespace = Settings.from_env().namespace
    metadata = {"namespace": namespace, "selection": "job", "job": job_id}
    writer = HistoryWriter(stream, metadata=metadata, codec=codec.value)
    for event in events:
        writer.write(event)
    writer.close()
    return writer.count


async def _export_range(selection: LogRange, stream: BinaryIO, codec: Codec, *, quiet: bool) -> int:
    settings = Settings.from_env()
    metadata = selection.metadata(settings.namespace)
    writer = HistoryWriter(stream, metadata=metadata, codec=codec.value)
    bar = progress_bar("exporting")
    task = bar.add_task("", total=None)

    def progress(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    try:
        if not quiet:
            bar.start()
        await export_range(settings, selection, writer, progress)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--partition") from None
    finally:
        bar.stop()
    writer.close()
    return writer.count


def _report(output: Path, count: int, as_json: bool) -> None:
    data = output.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if as_json:
        emit_json({"file": str(output), "events": count, "bytes": len(data), "sha256": digest})
    else:
        out.print(f"exported {count} events to {output} ({len(data)} bytes, sha256 {digest[:16]}…)")
