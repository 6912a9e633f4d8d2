"""``/v1/undecodable``: the records of the events topic that did not decode, with why (the
newest ``index_poison.POISON_KEPT`` of each partition)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from evsched.adapters.index.store import PartitionIndex
from evsched.api import reader
from evsched.api.context import Ctx
from evsched.api.listing import Cursor, CursorQuery, page
from evsched.api.models import at
from evsched.api.responses import READ
from evsched.core.state import TimelineEntry

router = APIRouter(prefix="/v1/undecodable", tags=["operations"])


class UndecodableRecord(BaseModel):
    """A record the fold could not decode: skipped, never applied, kept with its reason."""

    partition: int
    offset: int
    log_at: datetime
    size: int = Field(description="The record value's length in bytes.")
    reason: str


class UndecodablePage(BaseModel):
    records: list[UndecodableRecord]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; None: done.")
    scanned: int


@router.get("", response_model=UndecodablePage, responses=READ)
async def list_undecodable(
    ctx: Ctx,
    *,
    partition: Annotated[int | None, Query(ge=0, le=1 << 20)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: CursorQuery = None,
) -> UndecodablePage:
    """Undecodable records in (partition, offset) order, optionally of one partition.

    The index keeps the newest 1,000 of each partition (fold version 7); older ones are on the
    events log (`evsched export --partition P --from OFFSET`) or in an archive (`evsched
    archive`). A cursor past a record trimmed since goes on with the oldest one kept. The
    dashboard's lifetime total counts every one.
    """
    partitions = [p for p in reader.partitions(ctx.replica) if partition in (None, p)]

    def rows(p: int, after: str | None) -> Iterator[tuple[str, UndecodableRecord]]:
        return _records(ctx.replica.index(p), after)

    found = page(
        partitions,
        rows,
        lambda _: True,
        cursor=None if cursor is None else Cursor.decode(cursor),
        limit=limit,
        max_scan=ctx.max_scan,
    )
    return UndecodablePage(
        records=found.items, next_cursor=found.next_cursor, scanned=found.scanned
    )


def _records(index: PartitionIndex, after: str | None) -> Iterator[tuple[str, UndecodableRecord]]:
    # A cursor's position is an offset this API wrote as text; anything else starts over.
    start = int(after) if after is not None and after.isdecimal() and len(after) < 19 else -1
    for entry, raw in index.undecodable_records(start):
        yield str(entry.offset), view(entry, len(raw))


def view(entry: TimelineEntry, size: int) -> UndecodableRecord:
    return UndecodableRecord(
        partition=entry.partition,
        offset=entry.offset,
        log_at=at(entry.log_at),
        size=size,
        reason=entry.reason,
    )
