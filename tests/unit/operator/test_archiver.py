"""The archiver over the PartitionLog twin: files roll by count and size at offsets that depend
only on the records, markers are gaps, a crash (temp file, unreplaced tail) resumes without gap or
duplicate and ends byte for byte as a fresh archive, and a trimmed log is refused."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from evsched.adapters.archive.files import (
    ArchiveError,
    ArchiveLock,
    FileWriter,
    covering,
    listed,
    partition_events,
    read_manifest,
)
from evsched.adapters.archive.history_file import LoggedEvent, read_history
from evsched.operator.archive_metrics import ArchiveInstruments
from evsched.operator.archiver import Archiver, Roll
from evsched.testing import FrozenClock, MemoryPartitionLog

NS = "arch"


def filled(partitions: int = 2, records: int = 40) -> MemoryPartitionLog:
    """Records with keys and values of growing size; a marker after every seventh record."""
    log = MemoryPartitionLog(partitions=partitions)
    for p in range(partitions):
        for i in range(records):
            log.append(p, b"v" * (10 + i % 5), key=f"k{i}".encode(), log_at=1_000 + i)
            if i % 7 == 6:
                log.mark(p)
    return log


def archiver(log: MemoryPartitionLog, root: Path, roll: Roll, clock: FrozenClock) -> Archiver:
    return Archiver(
        log, root, namespace=NS, partitions=range(len(log.entries)), clock=clock, roll=roll
    )


async def archive_once(log: MemoryPartitionLog, root: Path, roll: Roll) -> Archiver:
    await log.start()
    a = archiver(log, root, roll, FrozenClock())
    await a.open()
    await a.run_to(await log.end_offsets(range(len(log.entries))))
    return a


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "evsched-archive.json"
    }


def offsets(log: MemoryPartitionLog, partition: int) -> list[int]:
    return [r.offset for r in log.entries[partition] if r is not None]


async def test_files_roll_by_count_with_markers_as_gaps(tmp_path: Path) -> None:
    log = filled(records=45)
    await archive_once(log, tmp_path, Roll(records=10))
    # Record i sits at offset i + i // 7 (a marker follows every seventh record); a file's name
    # gives the offsets of its first and last record, markers inside it included.
    assert [(f.first, f.last, f.tail) for f in listed(tmp_path, 0)] == [
        (0, 10, False),
        (11, 21, False),
        (22, 33, False),
        (34, 44, False),
        (45, 50, True),  # the last five records: a tail
    ]
    for p in (0, 1):
        assert [e.offset for e in partition_events(tmp_path, p)] == offsets(log, p)
        for f in listed(tmp_path, p):
            events = read_history(f.path).events
            assert (events[0].offset, events[-1].offset) == (f.first, f.last)
            assert read_history(f.path).metadata == {
                "namespace": NS,
                "selection": "archive",
                "partition": str(p),
                "from": str(f.first),
            }
    manifest = read_manifest(tmp_path)
    assert manifest == {"format": "evsched.archive/1", "namespace": NS, "partitions": 2}


async def test_files_roll_by_payload_size(tmp_path: Path) -> None:
    log = filled(partitions=1, records=20)
    await archive_once(log, tmp_path, Roll(records=1_000, payload_bytes=100))
    for f in listed(tmp_path, 0)[:-1]:
        events = read_history(f.path).events
        size = sum(len(e.key or b"") + len(e.value) for e in events)
        assert size >= 100 and size - len(events[-1].value) - len(events[-1].key or b"") < 100


async def test_a_resumed_archive_after_a_crash_equals_a_fresh_one(tmp_path: Path) -> None:
    log = filled(records=60)
    roll = Roll(records=8, tail_s=5.0)
    fresh = tmp_path / "fresh"
    await archive_once(log, fresh, roll)

    crashed = tmp_path / "crashed"
    await log.start()
    clock = FrozenClock()
    first = archiver(log, crashed, roll, clock)
    await first.open()
    targets = {0: 30, 1: 5}
    while any([await log.position(p) < t for p, t in targets.items()]):
        await first.step(targets=targets)
    clock.advance(10.0)
    first._tails_due()  # a tail for each open file, then the run dies mid-file
    await first.step(targets={0: 31, 1: 3})
    for part in first._parts.values():  # killed: the files being written stay as they are
        assert part.writer is not None
        part.writer._stream.close()
    leftovers = [p for p in (crashed / "p0000").iterdir() if p.name.endswith(".partial")]
    assert leftovers, "the crash left the file being written"
    assert any(f.tail for f in listed(crashed, 0))

    second = await archive_once(log, crashed, roll)
    assert not any(p.name.endswith(".partial") for p in crashed.rglob("*"))
    assert tree(crashed) == tree(fresh)
    for p in (0, 1):
        assert [e.offset for e in partition_events(crashed, p)] == offsets(log, p)
    assert second.state.archived_last == {p: offsets(log, p)[-1] for p in (0, 1)}


async def test_a_replaced_tail_left_by_a_crash_is_ignored_then_deleted(tmp_path: Path) -> None:
    log = filled(partitions=1, records=12)
    await archive_once(log, tmp_path, Roll(records=100))
    (tail,) = listed(tmp_path, 0)
    assert tail.tail
    # A shorter tail of the same start: the crash came between the rename and the unlink.
    short = FileWriter(tmp_path / "elsewhere", NS, 0, 0)
    short.write(LoggedEvent(partition=0, offset=0, log_at=1_000, key=b"k0", value=b"v", kind="x"))
    written = short.finish(tail=True)
    shutil.copy(written.path, tmp_path / "p0000" / written.path.name)
    assert len(listed(tmp_path, 0)) == 2
    assert covering(listed(tmp_path, 0)) == [tail]
    await archive_once(log, tmp_path, Roll(records=100))
    assert listed(tmp_path, 0) == [tail]


async def test_tails_show_recent_records_and_do_not_move_the_rolls(tmp_path: Path) -> None:
    log = MemoryPartitionLog(partitions=1)
    await log.start()
    clock = FrozenClock()
    a = archiver(log, tmp_path, Roll(records=5, tail_s=1.0), clock)
    await a.open()
    stop = asyncio.Event()
    for i in range(3):
        log.append(0, b"x", key=b"k", log_at=i)
    await a.step()
    clock.advance(2.0)
    await a.step()  # due: a tail of three, then the open file is read again
    assert [(f.first, f.last, f.tail) for f in listed(tmp_path, 0)] == [(0, 2, True)]
    await a.step()  # the three records read again
    assert await log.position(0) == 3
    clock.advance(2.0)
    await a.step()  # nothing new: no tail written, nothing read again
    assert await log.position(0) == 3 and len(a.state.files) == 1
    for i in range(4):
        log.append(0, b"y", key=b"k", log_at=10 + i)

    async def stop_when_sealed() -> None:
        if any(not f.tail for f in listed(tmp_path, 0)):
            stop.set()

    await asyncio.wait_for(a.run(stop, between=stop_when_sealed), 5)
    assert [(f.first, f.last, f.tail) for f in listed(tmp_path, 0)] == [
        (0, 4, False),
        (5, 6, True),
    ]


async def test_a_log_trimmed_past_the_archive_is_refused_unless_accepted(tmp_path: Path) -> None:
    log = filled(partitions=1, records=20)
    await archive_once(log, tmp_path, Roll(records=5))
    last = listed(tmp_path, 0)[-1]
    for i in range(10):
        log.append(0, b"z", key=b"k", log_at=5_000 + i)
    log.trim(0, last.last + 4)
    await log.start()
    a = archiver(log, tmp_path, Roll(records=5), FrozenClock())
    with pytest.raises(ArchiveError, match=r"log now starts at \d+.*--accept-gap"):
        await a.open()
    resumed = await a.open(accept_gap=True)
    assert resumed == {0: last.last + 4}


async def test_another_namespace_or_a_shorter_log_is_refused(tmp_path: Path) -> None:
    log = filled(partitions=1, records=10)
    await archive_once(log, tmp_path, Roll(records=5))
    other = Archiver(
        log, tmp_path, namespace="other", partitions=[0], clock=FrozenClock(), roll=Roll()
    )
    with pytest.raises(ArchiveError, match="archives namespace 'arch'"):
        await other.open()
    short = MemoryPartitionLog(partitions=1)
    short.append(0, b"a")
    await short.start()
    with pytest.raises(ArchiveError, match="another topic"):
        await archiver(short, tmp_path, Roll(records=5), FrozenClock()).open()


async def test_metrics_follow_the_files_and_the_lag(tmp_path: Path) -> None:
    instruments = ArchiveInstruments()
    log = filled(partitions=1, records=12)
    await log.start()
    a = Archiver(
        log,
        tmp_path,
        namespace=NS,
        partitions=[0],
        clock=FrozenClock(),
        roll=Roll(records=5),
        on_file=instruments.file_written,
    )
    await a.open()
    await a.run_to(await log.end_offsets([0]))
    instruments.positions(a.state.archived_last, {0: len(log.entries[0]) + 7})
    text = generate_latest(instruments.registry).decode()
    assert 'evsched_archive_files_total{kind="sealed"} 2.0' in text
    assert 'evsched_archive_files_total{kind="tail"} 1.0' in text
    assert "evsched_archive_records_total 12.0" in text
    last = offsets(log, 0)[-1]
    assert f'evsched_archive_last_offset{{partition="0"}} {float(last)}' in text
    lag = len(log.entries[0]) + 7 - last - 1
    assert f'evsched_archive_lag_records{{partition="0"}} {float(lag)}' in text


def test_one_archiver_per_directory(tmp_path: Path) -> None:
    held = ArchiveLock(tmp_path)
    with pytest.raises(ArchiveError, match="another evsched archive is writing"):
        ArchiveLock(tmp_path)
    held.release()
    ArchiveLock(tmp_path).release()


async def test_a_tail_whose_range_retention_cut_is_kept_as_it_is(tmp_path: Path) -> None:
    log = filled(partitions=1, records=12)
    await archive_once(log, tmp_path, Roll(records=100))
    (tail,) = listed(tmp_path, 0)
    log.append(0, b"late", key=b"k", log_at=9_999)
    log.trim(0, tail.first + 3)
    await archive_once(log, tmp_path, Roll(records=100))
    kept, newer = listed(tmp_path, 0)
    assert (kept.first, kept.last, kept.tail) == (tail.first, tail.last, False)
    assert (newer.first, newer.tail) == (tail.last + 1, True)
    assert [e.offset for e in partition_events(tmp_path, 0)] == offsets(log, 0)
