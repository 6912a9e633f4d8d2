"""The one restore path through the PartitionLog twin: folds up to a target past markers, batches
do not change the index, a foreign fold version is a typed error, and a partition's index is
rebuilt and swapped in (or refused when the log lost its start)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.adapters.index.store import IndexBatch, PartitionIndex
from evsched.core.controls import QUEUE
from evsched.core.events import JobCancelled, JobEnqueued, QueueLimitSet, QueuePaused
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Status
from evsched.errors import BrokerUnavailable, IndexVersionMismatch, RestoreRefused
from evsched.ports import Record
from evsched.runtime.projection.projector import Folded, Projector
from evsched.runtime.projection.restore import Restorer, open_index, rebuild_index, restore
from evsched.testing import MemoryPartitionLog


def enqueue(job_id: str) -> bytes:
    return avro.encode_event(
        JobEnqueued(
            event_id=f"e-{job_id}", job_id=job_id, emitted_at=0, source="t", task="t",
            queue="q", args=b"[]",
        )
    )  # fmt: skip


def cancel(job_id: str) -> bytes:
    return avro.encode_event(
        JobCancelled(event_id=f"c-{job_id}", job_id=job_id, emitted_at=0, source="t")
    )


def history(log: MemoryPartitionLog, partition: int = 0, jobs: int = 12) -> None:
    """Jobs enqueued, every third cancelled, transaction markers in between and at the end."""
    for i in range(jobs):
        log.append(partition, enqueue(f"j{i}"), key=f"j{i}".encode(), log_at=1_000 + i)
        if i % 3 == 0:
            log.append(partition, cancel(f"j{i}"), key=f"j{i}".encode(), log_at=1_000 + i)
            log.mark(partition)
    log.append(partition, b"\x00not avro", key=b"junk", log_at=2_000)
    log.mark(partition, 2)


def fresh(tmp_path: Path, name: str, partition: int = 0) -> Projector:
    return Projector(PartitionIndex(tmp_path / name, partition))


async def test_restore_folds_to_the_end_past_markers_and_reports_progress(tmp_path: Path) -> None:
    log = MemoryPartitionLog(partitions=1)
    history(log)
    await log.start()
    projector = fresh(tmp_path, "a")
    seen: list[int] = []
    folded = await restore(log, {0: projector}, fetch_records=5, progress=seen.append)
    records = sum(1 for entry in log.entries[0] if entry is not None)
    assert folded == records and seen[-1] == records and seen == sorted(seen)
    assert await log.position(0) == len(log.entries[0])  # past the trailing markers
    index = projector.index
    assert index.applied_offset() == max(e.offset for e in log.entries[0] if e is not None)
    j0, j1 = index.job("j0"), index.job("j1")
    assert j0 is not None and j0.status is Status.CANCELLED
    assert j1 is not None and j1.status is Status.SCHEDULED
    assert len(index.undecodable()) == 1
    assert index.fold_version() == FOLD_VERSION
    index.close()


async def test_a_target_stops_the_fold_and_batches_do_not_change_the_index(
    tmp_path: Path,
) -> None:
    log = MemoryPartitionLog(partitions=1)
    history(log)
    await log.start()
    target = 9  # offsets 0..8 folded, whatever a read returns beyond
    digests = set()
    for name, batch, fetch in (("one", 0, 1), ("some", 4, 3), ("all", 1_000, 1_000)):
        projector = fresh(tmp_path, name)
        await restore(log, {0: projector}, {0: target}, batch_records=batch, fetch_records=fetch)
        assert projector.index.applied_offset() == 8
        digests.add(projector.index.digest())
        projector.index.close()
    assert len(digests) == 1

    # From where an index stands: the rest of the log folded on top equals one fold of it all.
    partial, whole = fresh(tmp_path, "partial"), fresh(tmp_path, "whole")
    await restore(log, {0: partial}, {0: 5})
    await restore(log, {0: partial})
    await restore(log, {0: whole})
    assert partial.index.digest() == whole.index.digest()
    partial.index.close()
    whole.index.close()


async def test_many_partitions_and_a_failing_fold_reported_without_stopping_the_rest(
    tmp_path: Path,
) -> None:
    log = MemoryPartitionLog(partitions=2)
    history(log, 0, jobs=3)
    history(log, 1, jobs=3)
    await log.start()
    projectors = {p: fresh(tmp_path, f"p{p}", p) for p in (0, 1)}

    def broken(folded: object) -> None:
        raise OverflowError("index key")

    projectors[0].commit = broken  # type: ignore[method-assign]
    failures: list[tuple[int, int, str]] = []
    restorer = Restorer(
        log, projectors, on_fold_error=lambda p, o, e: failures.append((p, o, repr(e)))
    )
    restorer.seek()
    await restorer.read_once([0, 1], timeout_s=0)
    assert failures == [(0, 0, "OverflowError('index key')")]
    assert projectors[0].next_offset == 0  # read again from its index next time
    assert projectors[1].index.job("j0") is not None
    with pytest.raises(OverflowError):  # without a handler, a failing fold raises
        await Restorer(log, {0: projectors[0]}).run_to({0: 3})
    for projector in projectors.values():
        projector.index.close()


async def test_broker_failures_surface_as_broker_unavailable(tmp_path: Path) -> None:
    log = MemoryPartitionLog(partitions=1)
    history(log, jobs=1)
    await log.start()
    log.fail_next = True
    projector = fresh(tmp_path, "a")
    with pytest.raises(BrokerUnavailable):
        await restore(log, {0: projector})
    projector.index.close()


def write_foreign_version(data_dir: Path, partition: int, version: int) -> None:
    """Rewrite the fold-version marker as another fold version would have left it."""
    index = PartitionIndex(data_dir / f"p{partition:04d}", partition)
    index.write(IndexBatch(), index.applied_offset(), version)
    index.close()


def test_an_index_of_another_fold_version_is_a_typed_error(tmp_path: Path) -> None:
    open_index(tmp_path, 2).close()  # new: no version yet, fine
    write_foreign_version(tmp_path, 2, FOLD_VERSION + 1)
    with pytest.raises(IndexVersionMismatch) as raised:
        open_index(tmp_path, 2)
    assert (raised.value.partition, raised.value.found) == (2, FOLD_VERSION + 1)
    assert raised.value.expected == FOLD_VERSION
    PartitionIndex(tmp_path / "p0002", 2).close()  # closed again: its lock is free


async def test_a_foreign_index_is_rebuilt_from_the_log_and_swapped_in(tmp_path: Path) -> None:
    log = MemoryPartitionLog(partitions=1)
    history(log)
    await log.start()
    data = tmp_path / "node"
    old = open_index(data, 0)
    await restore(log, {0: Projector(old)})
    old.close()
    write_foreign_version(data, 0, FOLD_VERSION - 1)
    mismatch = IndexVersionMismatch(0, FOLD_VERSION - 1, FOLD_VERSION)

    rebuilt = await rebuild_index(log, data, mismatch, until=9)
    assert (rebuilt.old_version, rebuilt.new_version) == (FOLD_VERSION - 1, FOLD_VERSION)
    assert rebuilt.applied_offset == 8 and rebuilt.records == 7
    assert sorted(p.name for p in data.iterdir()) == ["p0000"]  # nothing left aside
    index = open_index(data, 0)  # this fold version now
    reference = fresh(tmp_path, "reference")
    await restore(log, {0: reference}, {0: 9})
    assert index.digest() == reference.index.digest()
    index.close()
    reference.index.close()


async def test_a_rebuild_that_would_lose_trimmed_history_is_refused(tmp_path: Path) -> None:
    log = MemoryPartitionLog(partitions=1)
    history(log)
    log.trim(0, 4)
    await log.start()
    data = tmp_path / "node"
    open_index(data, 0).close()
    write_foreign_version(data, 0, FOLD_VERSION + 1)
    mismatch = IndexVersionMismatch(0, FOLD_VERSION + 1, FOLD_VERSION)
    with pytest.raises(RestoreRefused, match="starts at offset 4"):
        await rebuild_index(log, data, mismatch, until=10)
    with pytest.raises(IndexVersionMismatch):  # the old index is left as it was
        open_index(data, 0)
    # Nothing committed yet: nothing of the partition's history is needed, a fresh index is right.
    rebuilt = await rebuild_index(log, data, mismatch, until=0)
    assert rebuilt.records == 0 and rebuilt.applied_offset == -1
    open_index(data, 0).close()


async def rewinding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: bytes
) -> tuple[Projector, Restorer]:
    """A restorer over ``first`` then an enqueue, whose fold fails once on the enqueue: the
    first read drops the batch, a second seek and read folds both (not committed yet)."""
    log = MemoryPartitionLog(partitions=1)
    log.append(0, first, key=b"q")
    log.append(0, enqueue("j0"), key=b"j0")
    await log.start()
    projector = fresh(tmp_path, "a")
    fold_one = projector._fold_one
    failed: list[int] = []

    def fails_once(record: Record, out: Folded) -> None:
        if record.offset == 1 and not failed:
            raise ValueError("boom")
        fold_one(record, out)

    monkeypatch.setattr(projector, "_fold_one", fails_once)
    restorer = Restorer(
        log, {0: projector}, batch_records=100, on_fold_error=lambda p, o, e: failed.append(o)
    )
    restorer.seek()
    assert await restorer.read_once([0]) == 0
    assert failed == [0]
    return projector, restorer


async def test_a_rewound_batch_leaves_no_pause_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch dropped by a fold error is folded again from the index: a queue it paused is not
    paused meanwhile (a lease before the pause would be refused on the second fold)."""
    pause = QueuePaused(event_id="p", queue="q", emitted_at=0, source="t")
    projector, restorer = await rewinding(tmp_path, monkeypatch, avro.encode_event(pause))
    assert projector.paused(QUEUE) == set()
    restorer.seek()
    assert await restorer.read_once([0]) == 2
    assert projector.paused(QUEUE) == set()  # folded, not committed yet
    restorer.flush()
    assert projector.paused(QUEUE) == {"q"}
    projector.index.close()


async def test_a_rewound_batch_leaves_no_limit_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Limits follow the pause sets: a batch dropped by a fold error leaves the projector's
    limits as the index holds them; only the commit of the second fold sets them."""
    limit = QueueLimitSet(event_id="l", queue="q", emitted_at=0, source="t", max_running=1)
    projector, restorer = await rewinding(tmp_path, monkeypatch, avro.encode_event(limit))
    assert projector.limits == {} and projector.limit("q") is None
    restorer.seek()
    assert await restorer.read_once([0]) == 2
    assert projector.limits == {}  # folded, not committed yet
    restorer.flush()
    state = projector.limit("q")
    assert state is not None and state.max_running == 1 and projector.limits == {"q": state}
    assert projector.index.applied_offset() == 1
    projector.index.close()
