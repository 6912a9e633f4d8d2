"""Opening a partition's index with the changelog: keep it, restore it, rebuild it, or refuse.

Every reader that keeps an index (a node, the API's replica, the operator's local replica)
compares its local index with the events log's start and the changelog's newest meta record
(``plan_open``). An index that is missing, of another fold version or behind the log's start is
restored from the changelog when a snapshot covers the gap; when none does and the log was
trimmed, the partition is refused loudly, never started from the log's start. A node whose own
index the changelog does not cover yet (an upgrade, a rebuild from the log) seeds it.
"""

from __future__ import annotations

import enum
import functools
import itertools
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from evsched.adapters.index.store import PartitionIndex
from evsched.core.fold import FOLD_VERSION
from evsched.errors import RestoreRefused
from evsched.ports import Holdback, Outgoing, PartitionLog, PartitionOutbox
from evsched.runtime.process.offload import Offload, in_turn, made
from evsched.runtime.projection.changelog import (
    META_FORMAT,
    ChangelogWriter,
    Meta,
    changelog_keys,
    restore_into,
)
from evsched.runtime.projection.restore import fresh_index, index_path, swap_in

# An index (an empty one too) more records than this behind the changelog's snapshot is restored
# rather than folded forward: a restore costs the live keys, a fold the records in between.
RESTORE_AHEAD_RECORDS = 10_000
# Records per transaction while seeding a changelog with a whole index.
SEED_RECORDS = 5_000


class Action(enum.Enum):
    USE_LOCAL = "use_local"  # fold the log from the local index's offset on
    RESTORE = "restore"  # load the changelog's snapshot, then fold from its offset on
    REBUILD = "rebuild"  # another fold version's index and a whole log: refold from offset 0
    REFUSE = "refuse"  # history is missing from every source: an operator must act


@dataclass(frozen=True, slots=True)
class OpenPlan:
    action: Action
    seed: bool = False  # the changelog does not hold this index yet: write it there (nodes)
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalIndex:
    """What a partition's local index says of itself (-1 and None: missing or empty)."""

    applied_offset: int = -1
    fold_version: int | None = None


def local_index(data_dir: Path, partition: int) -> LocalIndex:
    """What the partition's index under ``data_dir`` says of itself, without creating one."""
    path = index_path(data_dir, partition)
    if not path.is_dir():
        return LocalIndex()
    index = PartitionIndex(path, partition)
    try:
        return LocalIndex(applied_offset=index.applied_offset(), fold_version=index.fold_version())
    finally:
        index.close()


def plan_open(
    local: LocalIndex, *, log_start: int, meta: Meta | None, owner: bool = False
) -> OpenPlan:
    """What to do with a partition's local index, given the log's start and the changelog.

    An ``owner`` (a node, which writes the changelog) whose index is ahead of the changelog's
    snapshot (it crashed between a step and its flush) restores from the changelog: the keys
    its index changed since the snapshot are nowhere listed, so writing on from it would leave
    them out (Kafka Streams wipes an uncleanly closed store under exactly-once alike).
    """
    other_version = local.fold_version not in (None, FOLD_VERSION)
    snapshot = meta is not None and meta.covers(FOLD_VERSION, log_start)
    if not other_version and local.applied_offset + 1 >= log_start:
        if snapshot and meta is not None and _far_behind(local.applied_offset, meta):
            return OpenPlan(Action.RESTORE)
        if owner and snapshot and meta is not None and _ahead(local.applied_offset, meta):
            return OpenPlan(Action.RESTORE, reason="the index is ahead of its changelog")
        return OpenPlan(Action.USE_LOCAL, seed=not _covered(local.applied_offset, meta))
    if snapshot:
        return OpenPlan(Action.RESTORE)
    if other_version and log_start == 0:
        return OpenPlan(Action.REBUILD)
    return OpenPlan(Action.REFUSE, reason=refusal(local, log_start, meta))


def _far_behind(applied: int, meta: Meta) -> bool:
    # Folding a few records is quicker than a restore's round trips, even into an empty index.
    return meta.applied_offset - applied > RESTORE_AHEAD_RECORDS


def _ahead(applied: int, meta: Meta) -> bool:
    return meta.format == META_FORMAT and applied > meta.applied_offset


def _covered(applied: int, meta: Meta | None) -> bool:
    """Whether the changelog, in this version's format, holds every change of a local index at
    ``applied`` (a node writes on from there)."""
    return applied < 0 or (
        meta is not None and meta.format == META_FORMAT and meta.covers(FOLD_VERSION, applied + 1)
    )


def refusal(local: LocalIndex, log_start: int, meta: Meta | None) -> str:
    """Why a partition cannot open: the offsets and versions involved, and the remedy."""
    if local.fold_version is None:
        have = "no local index"
    else:
        have = f"a local index at offset {local.applied_offset} (fold version {local.fold_version})"
    if meta is None:
        snapshot = "the changelog <ns>.state holds no snapshot"
    else:
        state = "complete" if meta.complete else "incomplete (seeding)"
        snapshot = (
            f"the changelog's newest snapshot is at offset {meta.applied_offset}, fold version "
            f"{meta.fold_version}, {state}"
        )
    return (
        f"the events log starts at offset {log_start} (trimmed), there is {have}, and "
        f"{snapshot} (fold version {FOLD_VERSION} needed): starting from the log's start would "
        "lose the jobs whose records are gone; restore the index or the <ns>.state topic from a "
        "backup, or the events from an archive, then reopen"
    )


async def restore_partition(
    log: PartitionLog,
    data_dir: Path,
    partition: int,
    *,
    log_start: int,
    offload: Offload = in_turn,
) -> Meta:
    """Load the partition's changelog into a fresh index and swap it in for the local one.

    ``log`` reads the partition of ``<ns>.state``. Raises RestoreRefused when the changelog
    holds no snapshot that covers the log from ``log_start`` on; the local index is left as is.
    Every blocking step (the scratch index's open, writes and close, the renames) runs through
    ``offload``: a node's index threads, or by default on the loop, in turns.
    """
    scratch = data_dir / f".p{partition:04d}.restoring"
    # A cancelled restore (the partition revoked) must not leave the scratch index open.
    opened = functools.partial(fresh_index, scratch, partition)
    index = await made(offload, opened, PartitionIndex.close)
    try:
        meta = await restore_into(log, partition, index, offload)
    finally:
        await offload(index.close)
    if meta is None or not meta.covers(FOLD_VERSION, log_start):
        await offload(functools.partial(shutil.rmtree, scratch, ignore_errors=True))
        local = LocalIndex()
        raise RestoreRefused(partition, refusal(local, log_start, meta))
    await offload(functools.partial(swap_in, data_dir, partition, scratch))
    return meta


async def seed(
    log: PartitionLog,
    outbox: PartitionOutbox,
    holdback: Holdback,
    writer: ChangelogWriter,
    index: PartitionIndex,
) -> int:
    """Write the whole index to the changelog (its partition read by ``log``); records sent.

    The first transaction marks the snapshot incomplete, so a restore meanwhile refuses it; then
    every key the changelog held is deleted (a tombstone), whatever its format, before the
    index's records are written, so a restore of the result reads no older record over a newer
    one (a format-1 ``jobs`` record would otherwise delete what a job's record put); the last
    transaction marks the snapshot complete.
    """
    stale = await changelog_keys(log, writer.partition)
    applied = index.applied_offset()
    seeding = Meta(applied, FOLD_VERSION, complete=False)
    await outbox.send([writer.meta(seeding)], offset=None, holdback=holdback)
    gone = (writer.tombstone(key) for key in sorted(stale))
    sent = 1
    for chunk in _chunks(itertools.chain(gone, writer.snapshot(index))):
        await outbox.send(chunk, offset=None, holdback=holdback)
        sent += len(chunk)
    await outbox.send([writer.meta(Meta(applied, FOLD_VERSION))], offset=None, holdback=holdback)
    return sent + 1


def _chunks(records: Iterator[Outgoing]) -> Iterator[list[Outgoing]]:
    chunk: list[Outgoing] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= SEED_RECORDS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
