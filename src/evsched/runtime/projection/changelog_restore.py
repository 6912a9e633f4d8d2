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
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from evsched.adapters.index.store import PartitionIndex
from evsched.core.fold import FOLD_VERSION
from evsched.errors import RestoreRefused
from evsched.ports import Holdback, Outgoing, PartitionLog, PartitionOutbox
from evsched.runtime.process.offload import Offload, in_turn, made
from evsched.runtime.projection.changelog import ChangelogWriter, Meta, changelog_keys, restore_into
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


def plan_open(local: LocalIndex, *, log_start: int, meta: Meta | None) -> OpenPlan:
    """What to do with a partition's local index, given the log's start and the changelog."""
    other_version = local.fold_version not in (None, FOLD_VERSION)
    snapshot = meta is not None and meta.covers(FOLD_VERSION, log_start)
    if not other_version and local.applied_offset + 1 >= log_start:
        if snapshot and meta is not None and _far_behind(local.applied_offset, meta):
            return OpenPlan(Action.RESTORE)
        return OpenPlan(Action.USE_LOCAL, seed=not _covered(local.applied_offset, meta))
    if snapshot:
        return OpenPlan(Action.RESTORE)
    if other_version and log_start == 0:
        return OpenPlan(Action.REBUILD)
    return OpenPlan(Action.REFUSE, reason=refusal(local, log_start, meta))


def _far_behind(applied: int, meta: Meta) -> bool:
    # Folding a few records is quicker than a restore's round trips, even into an empty index.
    return meta.applied_offset - applied > RESTORE_AHEAD_RECORDS


def _covered(applied: int, meta: Meta | None) -> bool:
    """Whether the changelog holds every change of a local index at ``applied``."""
    return applied < 0 or (meta is not None and meta.covers(FOLD_VERSION, applied + 1))


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

    The first transaction marks the snapshot incomplete, so a restore meanwhile refuses it; the
    last one deletes the keys the changelog held that the index does not, then marks it complete.
    """
    stale = await changelog_keys(log, writer.partition)
    applied = index.applied_offset()
    seeding = Meta(applied, FOLD_VERSION, complete=False)
    await outbox.send([writer.meta(seeding)], offset=None, holdback=holdback)
    sent = 0
    for chunk in _chunks(writer.snapshot(_seen(index, stale))):
        await outbox.send(chunk, offset=None, holdback=holdback)
        sent += len(chunk)
    gone = [writer.snapshot([(family, key, None)]) for family, key in sorted(stale)]
    last = [record for records in gone for record in records]
    last.append(writer.meta(Meta(applied, FOLD_VERSION)))
    await outbox.send(last, offset=None, holdback=holdback)
    return sent + len(last) + 1


def _seen(
    index: PartitionIndex, stale: set[tuple[str, bytes]]
) -> Iterator[tuple[str, bytes, bytes | None]]:
    """The index's keys; each one found is taken out of ``stale`` on the way."""
    for family, key, value in index.mirrored():
        stale.discard((family, key))
        yield family, key, value


def _chunks(records: Iterator[Outgoing]) -> Iterator[list[Outgoing]]:
    chunk: list[Outgoing] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= SEED_RECORDS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
