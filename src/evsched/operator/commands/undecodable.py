"""``evsched undecodable``: records of the events topic that did not decode, from the replica."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from evsched.operator.readings import iso
from evsched.operator.render import emit_json, out
from evsched.operator.replica_dir import DEFAULT_TIMEOUT_S, LocalIndex
from evsched.operator.session import (
    DEFAULT_DATA_DIR,
    DataDir,
    Json,
    Offline,
    ReplicaOptions,
    TimeoutS,
    replica,
    run,
)


def find_undecodable(
    local: LocalIndex, *, partition: int | None, limit: int
) -> list[dict[str, Any]]:
    """Up to ``limit`` undecodable records, in (partition, offset) order."""
    found: list[dict[str, Any]] = []
    for p, index in sorted(local.indexes.items()):
        if partition is not None and p != partition:
            continue
        for entry, raw in index.undecodable_records():
            found.append(
                {
                    "partition": entry.partition,
                    "offset": entry.offset,
                    "log_at": entry.log_at,
                    "size": len(raw),
                    "reason": entry.reason,
                }
            )
            if len(found) >= limit:
                return found
    return found


def undecodable(
    *,
    partition: Annotated[
        int | None, typer.Option("--partition", min=0, help="Only this events partition.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 100,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    offline: Offline = False,
    timeout_s: TimeoutS = DEFAULT_TIMEOUT_S,
    as_json: Json = False,
) -> None:
    """List records of the events topic that did not decode (skipped by the fold), with why.

    The index keeps the newest 1,000 of each partition; older ones are on the events log
    (evsched export --partition P --from OFFSET) or in an archive (evsched archive).
    """
    options = ReplicaOptions(data_dir=data_dir, offline=offline, timeout_s=timeout_s, quiet=as_json)

    async def main() -> None:
        async with replica(options) as local:
            found = find_undecodable(local, partition=partition, limit=limit)
        if as_json:
            emit_json(found)
            return
        table = Table("partition", "offset", "log time", "bytes", "reason")
        for row in found:
            table.add_row(
                str(row["partition"]),
                str(row["offset"]),
                iso(row["log_at"]),
                str(row["size"]),
                escape(row["reason"]),
            )
        out.print(table)
        out.print(f"{len(found)} undecodable record(s)")

    run(main)
