"""The RocksDB index and the projector on a real RocksDB: queues move with state, writes are atomic
with the offset, timelines keep every verdict, and two folds of one log have one digest."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.adapters.index import store as index_module
from evsched.adapters.index.keys import (
    JOB_TIMELINE,
    PERMIT_TIMELINE,
    QUEUE_TIMELINE,
    SCHEDULE_TIMELINE,
    TIMELINE,
    timeline_family,
    timeline_key,
)
from evsched.adapters.index.purge import Purge, PurgeWriter
from evsched.adapters.index.store import PartitionIndex
from evsched.core import events as ev
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Status, TimelineEntry, Verdict
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PartitionIndex]:
    idx = PartitionIndex(tmp_path / "p0", 0)
    yield idx
    idx.close()


class Log:
    """Encoded records at increasing offsets, as a partition of the events topic holds them."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, event: ev.Event | bytes, log_at: int) -> Record:
        value = event if isinstance(event, bytes) else avro.encode_event(event)
        record = Record("t.events", 0, len(self.records), log_at, b"k", value)
        self.records.append(record)
        return record


def enqueued(job_id: str, run_at: int | None = None, **kw: object) -> ev.JobEnqueued:
    return ev.JobEnqueued(
        event_id=f"e-{job_id}",
        job_id=job_id,
        emitted_at=0,
        source="client",
        task="t",
        queue="q",
        args=b"[]",
        run_at=run_at,
        **kw,  # type: ignore[arg-type]
    )


def leased(job_id: str, token: int, attempt: int = 1) -> ev.JobLeased:
    return ev.JobLeased(
        event_id=f"l-{job_id}-{token}",
        job_id=job_id,
        emitted_at=0,
        source="node-1",
        token=token,
        attempt=attempt,
        lease_ms=1_000,
    )


def started(job_id: str, token: int) -> ev.AttemptStarted:
    return ev.AttemptStarted(
        event_id=f"s-{job_id}-{token}",
        job_id=job_id,
        emitted_at=0,
        source="worker-1",
        token=token,
        worker_id="w1",
        lease_ms=5_000,
    )


def succeeded(job_id: str, token: int, eid: str | None = None) -> ev.AttemptSucceeded:
    return ev.AttemptSucceeded(
        event_id=eid or f"ok-{job_id}-{token}",
        job_id=job_id,
        emitted_at=0,
        source="worker-1",
        token=token,
        result=b"1",
        effects=(ev.Effect(kind="mail", payload=b"hi"),),
    )


def fold_all(index: PartitionIndex, records: list[Record]) -> Projector:
    projector = Projector(index)
    projector.commit(projector.fold(records))
    return projector


def test_due_and_lease_queues_follow_the_job(index: PartitionIndex) -> None:
    log = Log()
    log.add(enqueued("a", run_at=2_000), 1_000)
    log.add(enqueued("b"), 1_000)
    projector = fold_all(index, log.records)
    assert index.due_by_priority(now=1_500, limit=10) == ["b"]
    assert index.due_by_priority(now=2_000, limit=10) == ["b", "a"]
    assert index.next_due_at() == 1_000

    more = [log.add(leased("b", 1), 1_600), log.add(started("b", 1), 1_700)]
    projector.commit(projector.fold(more))
    assert index.due_by_priority(now=5_000, limit=10) == ["a"]
    assert index.expired_lease_ids(now=6_700, limit=10) == ["b"]  # 1_700 + 5_000
    assert index.expired_lease_ids(now=6_699, limit=10) == []
    assert projector.in_flight == {"q": 1}
    assert index.in_flight_by_queue() == {"q": 1}
    assert index.applied_offset() == 3
    assert index.fold_version() == FOLD_VERSION


def test_effects_only_from_the_applied_success_and_timeline_keeps_every_verdict(
    index: PartitionIndex,
) -> None:
    log = Log()
    for event, at in [
        (enqueued("a"), 1_000),
        (leased("a", 1), 1_001),
        (started("a", 1), 1_002),
        (succeeded("a", 1), 1_003),
        (succeeded("a", 1, eid="retry"), 1_004),
    ]:
        log.add(event, at)
    log.add(b"\x00garbage", 1_005)
    projector = Projector(index)
    folded = projector.fold(log.records)
    assert [(e.job_id, e.token, e.effect.kind) for e in folded.effects] == [("a", 1, "mail")]
    projector.commit(folded)
    verdicts = [(t.kind, t.verdict) for t in index.timeline("a")]
    assert verdicts[-1][0] == "AttemptSucceeded"
    assert verdicts[-1][1] is not Verdict.APPLIED
    assert [v for _, v in verdicts[:-1]] == [Verdict.APPLIED] * 4
    (bad,) = index.undecodable()
    assert bad.offset == 5 and bad.verdict is Verdict.UNDECODABLE and bad.reason
    state = index.job("a")
    assert state is not None and state.status is Status.SUCCEEDED


def test_reopen_resumes_and_two_folds_of_one_log_share_a_digest(tmp_path: Path) -> None:
    log = Log()
    for i in range(50):
        log.add(enqueued(f"j{i}", run_at=1_000 + i), 900)
    log.add(leased("j1", 1), 1_001)

    live = PartitionIndex(tmp_path / "live", 0)
    fold_all(live, log.records[:20])
    live.close()
    live = PartitionIndex(tmp_path / "live", 0)  # resume after a restart
    assert live.applied_offset() == 19
    fold_all(live, log.records[20:])

    rebuilt = PartitionIndex(tmp_path / "rebuilt", 0)
    fold_all(rebuilt, log.records)
    assert live.digest() == rebuilt.digest()

    other = PartitionIndex(tmp_path / "other", 0)
    fold_all(other, log.records[:-1])
    assert other.digest() != rebuilt.digest()
    for idx in (live, rebuilt, other):
        idx.close()


def test_events_for_unknown_jobs_are_audited_without_creating_state(index: PartitionIndex) -> None:
    log = Log()
    log.add(started("ghost", 3), 1_000)
    fold_all(index, log.records)
    assert index.job("ghost") is None
    (entry,) = index.timeline("ghost")
    assert entry.verdict is Verdict.REJECTED


def test_a_record_handed_out_twice_is_folded_once(index: PartitionIndex) -> None:
    log = Log()
    log.add(enqueued("a"), 1_000)
    log.add(leased("a", 1), 1_001)
    projector = Projector(index)
    projector.commit(projector.fold(log.records))
    again = projector.fold(log.records)  # a consumer that redelivers after a seek
    assert again.last_offset is None and not again.batch
    fresh = Projector(index)  # and after a restart, from the stored offset
    assert fresh.fold(log.records).last_offset is None
    assert [e.verdict for e in index.timeline("a")] == [Verdict.APPLIED, Verdict.APPLIED]


def test_timeline_keeps_each_events_bytes_for_audits(index: PartitionIndex) -> None:
    log = Log()
    log.add(enqueued("a"), 1_000)
    log.add(leased("a", 1), 1_001)
    fold_all(index, log.records)
    stored = index.timeline_events("a")
    assert [raw for _, raw in stored] == [r.value for r in log.records]
    assert [avro.decode_event(raw).event_id for _, raw in stored] == [e.event_id for e, _ in stored]


class _PurgeTarget:
    """Of the index, only what a PurgeWriter reads: an empty one."""

    def h(self, name: str) -> str:
        return name

    def scan(
        self, name: str, start: bytes = b"", end: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        return iter(())

    def ranges(self, name: str) -> Callable[[bytes, bytes], Iterator[bytes]]:
        return lambda start, end: iter(())

    def delete_secondary(self, wb: object, state: object) -> None:
        pass

    def low(self, name: str) -> int:
        return 0

    def lower(self, name: str, at: int) -> None:
        pass

    def raise_low(self, name: str, at: int) -> None:
        pass


class _Deletes:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, bytes]] = []

    def put(self, key: bytes, value: bytes, handle: str) -> None:
        pass

    def delete(self, key: bytes, handle: str) -> None:
        self.deleted.append((handle, key))


def test_every_event_kind_has_its_timeline_family() -> None:
    """A limit's permit steps have a family of their own (fold version 7): the queue's holds
    only pauses and limit settings, which time travel and ``--wait`` read whole."""
    queue = {ev.QueuePaused, ev.QueueResumed, ev.QueueLimitSet, ev.KeyLimitSet}
    schedule = {*ev.SCHEDULE_EVENT_TYPES, ev.SchedulePaused, ev.ScheduleResumed}
    for cls in ev.EVENT_TYPES:
        expected = QUEUE_TIMELINE if cls in queue else JOB_TIMELINE
        expected = SCHEDULE_TIMELINE if cls in schedule else expected
        expected = PERMIT_TIMELINE if cls is ev.QueuePermit else expected
        assert timeline_family(cls.__name__) == expected, cls
    families = {JOB_TIMELINE, SCHEDULE_TIMELINE, QUEUE_TIMELINE, PERMIT_TIMELINE}
    assert len(families) == 4 and all(len(family) == 1 for family in families)


def test_a_purge_deletes_only_its_jobs_timeline_entries_of_the_batch() -> None:
    """A queue or schedule sharing the job's id keeps its entries, and no tombstone is written
    for a job entry that was never there (a queue's pause was taken for a job's entry)."""
    entry = TimelineEntry(
        partition=0,
        offset=0,
        log_at=0,
        kind="",
        event_id="e",
        source="t",
        verdict=Verdict.APPLIED,
        reason="",
    )
    kinds = ["JobEnqueued", "QueuePaused", "SchedulePaused", "ScheduleUpserted", "QueueResumed"]
    timeline = [
        ("x", replace(entry, offset=offset, kind=kind), b"") for offset, kind in enumerate(kinds)
    ]
    wb = _Deletes()
    purge = Purge(job_id="x", offset=9, log_at=100, stored=None, mark_until=10**6)
    PurgeWriter(_PurgeTarget(), wb, [purge], timeline).write()
    assert [key for handle, key in wb.deleted if handle == TIMELINE] == [timeline_key("x", 0)]


def test_rocksdbs_own_files_are_bounded(tmp_path: Path) -> None:
    """The info LOG rolls and keeps few files, and the MANIFEST is rewritten past its bound, so
    the index's disk stays flat in steady state (RocksDB's defaults grow both for ever)."""
    index = PartitionIndex(tmp_path / "p0", 0)
    index.close()
    written = "\n".join(
        p.read_text() for p in (tmp_path / "p0").iterdir() if p.name.startswith("OPTIONS-")
    )
    settings = dict(line.strip().split("=", 1) for line in written.splitlines() if "=" in line)
    assert settings["max_log_file_size"] == str(index_module.INFO_LOG_BYTES)
    assert settings["keep_log_file_num"] == str(index_module.INFO_LOGS_KEPT)
    assert settings["max_manifest_file_size"] == str(index_module.MANIFEST_BYTES)
