"""Long folds in chunks that let the event loop run between them (issue 9, the take-over stall).

A node's heartbeats, fetches and every partition's steps share one event loop. A partition that
catches up folds thousands of records in one step (the gap below the group's offset, then the
tail to the log's end); folded in one go on a loaded machine that held the loop for seconds, the
heir of a killed node missed its own heartbeats and the group rebalanced once more. Folding the
same records in the same order in chunks changes nothing the fold sees: ``Projector.fold`` takes
one record after the other into the ``Folded`` it is given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from evsched.adapters.index.writes import PreparedWrite
from evsched.ports import Record
from evsched.runtime.projection.projector import Folded, Projector

# Records folded between two yields: a few milliseconds of a core, a few tenths of a second on a
# machine loaded tenfold, well inside a 500 ms heartbeat interval and a 6 s session.
FOLD_CHUNK_RECORDS = 200


async def fold_chunked(
    projector: Projector,
    records: Sequence[Record],
    folded: Folded | None = None,
    *,
    chunk: int | None = None,
) -> Folded:
    """``projector.fold(records, folded)``, yielding to the event loop between chunks.

    Only the caller folds into ``projector`` meanwhile (a partition's runner, a restore): the
    result is the one fold would give. ``chunk`` defaults to ``FOLD_CHUNK_RECORDS``.
    """
    size = FOLD_CHUNK_RECORDS if chunk is None else chunk
    out = Folded() if folded is None else folded
    for start in range(0, len(records), size):
        if start:
            await asyncio.sleep(0)
        projector.fold(records[start : start + size], out)
    return out


async def refold_chunked(
    projector: Projector,
    records: Sequence[Record],
    *,
    chunk: int | None = None,
    applied: Callable[[PreparedWrite], None] | None = None,
) -> None:
    """Fold ``records`` and write them to the index a chunk at a time, yielding in between.

    For records whose outputs are already in the log (a new owner's gap below the group's
    offset): each chunk's changes and offset go in one WriteBatch, so the index stands at a
    chunk's end after each write, and ends where one fold and one write of them all would.
    ``applied`` is told each chunk's write once made (a node's changelog notes its keys).
    """
    size = FOLD_CHUNK_RECORDS if chunk is None else chunk
    for start in range(0, len(records), size):
        if start:
            await asyncio.sleep(0)
        folded = projector.fold(records[start : start + size])
        if applied is None:
            projector.commit(folded)
            continue
        prepared = projector.prepare(folded)
        projector.commit(folded, prepared)
        if prepared is not None:
            applied(prepared)
