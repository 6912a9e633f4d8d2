"""History read from an archive, with no broker: a rebuild from the archive and a trimmed log's
tail equals one from the whole log, offsets in neither are refused, an audit from the archive is
the index's audit, and ``evsched replay --archive`` replays an archive like its export."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from evsched.adapters import avro
from evsched.adapters.archive.history_file import LoggedEvent, write_history
from evsched.adapters.archive.partition_log import ArchivePartitionLog
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.partition_log import partition_for
from evsched.core.events import (
    AttemptStarted,
    AttemptSucceeded,
    Event,
    JobCancelled,
    JobEnqueued,
    JobLeased,
    JobPurged,
    JobRequeued,
    QueuePaused,
    QueueResumed,
)
from evsched.core.state import Verdict
from evsched.errors import RestoreRefused
from evsched.operator import register
from evsched.operator.archive_history import ArchiveThenLog, audit_from_archive
from evsched.operator.archiver import Archiver, Roll
from evsched.operator.audit import audit
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import restore
from evsched.testing import FrozenClock, MemoryPartitionLog
from tests.unit.operator.test_archiver import archive_once

JOBS = [f"job-{i}" for i in range(9)]
SMALL = Roll(records=3)


def events_of(job_id: str, i: int) -> list[bytes]:
    """An enqueue; every second job cancelled, every third of those requeued, plus a duplicate."""
    enqueue = avro.encode_event(
        JobEnqueued(
            event_id=f"e-{job_id}", job_id=job_id, emitted_at=0, source="t", task="t",
            queue="q", args=b"[]",
        )
    )  # fmt: skip
    out = [enqueue, enqueue]
    if i % 2 == 0:
        out.append(
            avro.encode_event(
                JobCancelled(event_id=f"c-{job_id}", job_id=job_id, emitted_at=0, source="t")
            )
        )
    if i % 4 == 0:
        out.append(
            avro.encode_event(
                JobRequeued(event_id=f"r-{job_id}", job_id=job_id, emitted_at=0, source="t")
            )
        )
    return out


def logged(partitions: int = 2) -> MemoryPartitionLog:
    """Every job's events on its partition (as Kafka routes it), interleaved, with markers."""
    log = MemoryPartitionLog(partitions=partitions)
    for round_ in range(4):
        for i, job in enumerate(JOBS):
            batch = events_of(job, i)
            if round_ < len(batch):
                p = partition_for(job, partitions)
                log.append(p, batch[round_], key=job.encode(), log_at=1_000 * round_ + i)
                if i % 3 == 0:
                    log.mark(p)
    log.append(0, b"\x00junk", key=b"junk", log_at=9_000)
    return log


async def rebuilt(tmp_path: Path, name: str, source: object, partition: int) -> tuple[int, str]:
    index = PartitionIndex(tmp_path / name, partition)
    try:
        assert isinstance(source, MemoryPartitionLog | ArchiveThenLog)
        await source.start()
        await restore(source, {partition: Projector(index)})
        return index.applied_offset(), index.digest()
    finally:
        index.close()


async def test_a_rebuild_from_the_archive_and_the_tail_equals_one_from_the_whole_log(
    tmp_path: Path,
) -> None:
    log = logged()
    root = tmp_path / "archive"
    # Archive the first part only; the rest stays in the log, whose head is then trimmed.
    cut = {p: len(log.entries[p]) // 2 for p in (0, 1)}
    await log.start()
    a = Archiver(log, root, namespace="ns", partitions=[0, 1], clock=FrozenClock(), roll=Roll())
    await a.open()
    await a.run_to(cut)
    for p in (0, 1):
        whole = await rebuilt(tmp_path, f"whole{p}", log, p)
        log.trim(p, cut[p] - 2)  # the log keeps a little of what the archive holds
        chained = ArchiveThenLog(ArchivePartitionLog(root, log.topic), log)
        assert await rebuilt(tmp_path, f"chained{p}", chained, p) == whole
        assert (await chained.start_offsets([p]))[p] == 0
        assert (await chained.end_offsets([p]))[p] == len(log.entries[p])


async def test_offsets_in_neither_the_archive_nor_the_log_are_refused(tmp_path: Path) -> None:
    log = logged(partitions=1)
    root = tmp_path / "archive"
    await log.start()
    a = Archiver(log, root, namespace="ns", partitions=[0], clock=FrozenClock(), roll=Roll())
    await a.open()
    await a.run_to({0: 10})
    log.trim(0, 14)
    chained = ArchiveThenLog(ArchivePartitionLog(root, log.topic), log)
    with pytest.raises(RestoreRefused, match=r"continues at offset \d+ but the log starts at 14"):
        await rebuilt(tmp_path, "gap", chained, 0)
    # An archive that does not start at 0 cannot give what came before it.
    late = tmp_path / "late"
    trimmed = logged(partitions=1)
    trimmed.trim(0, 5)
    await archive_once(trimmed, late, SMALL)
    with pytest.raises(RestoreRefused, match=r"its archive starts at offset \d+, so offsets 0\.\."):
        await rebuilt(tmp_path, "late", ArchiveThenLog(ArchivePartitionLog(late, "t"), log), 0)


async def test_an_audit_from_the_archive_is_the_index_audit(tmp_path: Path) -> None:
    log = logged()
    root = tmp_path / "archive"
    await archive_once(log, root, SMALL)
    indexes = {}
    for p in (0, 1):
        indexes[p] = PartitionIndex(tmp_path / f"index{p}", p)
        await restore(log, {p: Projector(indexes[p])})
    try:
        for job in [*JOBS, "no-such-job"]:
            found, sources = await audit_from_archive(root, job, offline=True)
            expected = audit(indexes[sources.partition], job)
            assert found == expected
            if job in JOBS:
                assert found is not None and len(found.rows) >= 2 and not found.drifted
                verdicts = {row.entry.verdict.value for row in found.rows}
                assert "duplicate" in verdicts and "applied" in verdicts
        whole, _ = await audit_from_archive(root, JOBS[0], offline=True)
        assert whole is not None
        first = whole.rows[0].entry.offset
        partial, _ = await audit_from_archive(root, JOBS[0], offline=True, as_of=first)
        assert partial is not None and len(partial.rows) == 1
        assert partial == audit(indexes[partial.partition], JOBS[0], as_of=first)
        assert sources.as_json()["history"]["log"] is None  # type: ignore[index]
        assert "archive offsets 0.." in sources.describe()
    finally:
        for index in indexes.values():
            index.close()


async def test_an_archive_audit_folds_purges_and_pauses_as_the_index_does(tmp_path: Path) -> None:
    meta = {"job_id": "j", "emitted_at": 0, "source": "s"}
    enqueue = {"task": "t", "queue": "q", "args": b"[]", "retention_ms": 0, **meta}
    lease = {"attempt": 1, "lease_ms": 1_000, **meta}
    pause = {"queue": "q", "emitted_at": 0, "source": "s"}
    history: list[Event] = [
        JobEnqueued(event_id="e1", **enqueue),  # type: ignore[arg-type]
        JobLeased(event_id="l1", token=1, **lease),  # type: ignore[arg-type]
        AttemptStarted(event_id="s1", token=1, worker_id="w", lease_ms=1_000, **meta),  # type: ignore[arg-type]
        AttemptSucceeded(event_id="o1", token=1, result=b"null", **meta),  # type: ignore[arg-type]
        JobPurged(event_id="p1", generation=0, **meta),  # type: ignore[arg-type]
        JobEnqueued(event_id="e2", **enqueue),  # type: ignore[arg-type]  # a new job: applied
        QueuePaused(event_id="qp", **pause),  # type: ignore[arg-type]
        JobLeased(event_id="l2", token=1, **lease),  # type: ignore[arg-type]  # held by the pause
        QueueResumed(event_id="qr", **pause),  # type: ignore[arg-type]
        JobLeased(event_id="l3", token=1, **lease),  # type: ignore[arg-type]
    ]
    log = MemoryPartitionLog()
    for at, event in enumerate(history):
        log.append(0, avro.encode_event(event), key=b"j", log_at=at)
    await archive_once(log, tmp_path / "archive", SMALL)
    index = PartitionIndex(tmp_path / "index", 0)
    try:
        await restore(log, {0: Projector(index)})
        found, _ = await audit_from_archive(tmp_path / "archive", "j", offline=True)
        indexed = audit(index, "j")
    finally:
        index.close()
    assert found is not None and indexed is not None and not found.drifted
    verdicts = [row.entry.verdict for row in found.rows]  # the queue's pause has no row
    assert verdicts == [*[Verdict.APPLIED] * 6, Verdict.REJECTED, Verdict.APPLIED]
    # The index keeps the purge's entry and what came after it, as the archive's audit folds it.
    assert [row.entry for row in found.rows[4:]] == [row.entry for row in indexed.rows]
    assert found.state == indexed.state


def test_replay_of_an_archive_matches_the_outcome_of_its_export(tmp_path: Path) -> None:
    log = logged()
    root = tmp_path / "archive"
    asyncio.run(archive_once(log, root, SMALL))
    export = tmp_path / "h.history.avro"
    events = [
        LoggedEvent.from_record(r)
        for p in sorted(log.entries)
        for r in log.entries[p]
        if r is not None
    ]
    with export.open("wb") as stream:
        write_history(stream, events, metadata={"namespace": "ns"})
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    recorded = runner.invoke(app, ["replay", str(export), "--update-expected"])
    assert recorded.exit_code == 0, recorded.output
    expected = tmp_path / "h.expected.json"
    result = runner.invoke(
        app, ["replay", "--archive", str(root), "--expected", str(expected), "--json"]
    )
    assert result.exit_code == 0, result.output
    (document,) = json.loads(result.stdout)
    assert document["identical"] is True and document["events"] == len(events)
    assert document["undecodable"] == 1

    # A different history does not replay to the same outcome.
    (root / "p0001" / sorted(p.name for p in (root / "p0001").iterdir())[-1]).unlink()
    diverged = runner.invoke(app, ["replay", "--archive", str(root), "--expected", str(expected)])
    assert diverged.exit_code == 1, diverged.output
    missing = runner.invoke(app, ["replay", "--archive", str(root)])
    assert missing.exit_code == 2 and "--expected" in missing.output
    both = runner.invoke(app, ["replay", str(export), "--archive", str(root), "--expected", "x"])
    assert both.exit_code == 2
