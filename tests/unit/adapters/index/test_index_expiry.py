"""Timeline entries of entities that are never purged expire from the log (fold version 7), on a
real RocksDB: a limit's permit steps, and rejected events of schedules the index does not hold,
each at the first applied purge at or after its log time plus ``retention.ORPHAN_KEPT_MS``;
beside the job orphans of fold version 6, however the records are batched, and after a restore.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from evsched.adapters.index.keys import (
    FOLLOWERS,
    ORPHANS,
    PERMIT_TIMELINE,
    SCHEDULE_TIMELINE,
    TIMELINE,
)
from evsched.adapters.index.orphans import orphan_key
from evsched.adapters.index.store import PartitionIndex
from evsched.core import ids, retention
from evsched.core.events import (
    JobTemplate,
    QueueLimitSet,
    QueuePermit,
    ScheduleDeleted,
    ScheduleFired,
    SchedulePaused,
    ScheduleUpserted,
)
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Verdict
from evsched.operator.audit import audit
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector
from tests.unit.adapters.index.test_index_orphans import Log
from tests.unit.index_folds import fold_into, folded

KEPT = retention.ORPHAN_KEPT_MS
LIMIT = "mail"  # a queue no job of these logs is on: its limit guards none of them


def limit_set(log: Log, at: int) -> None:
    event = QueueLimitSet(
        event_id=f"l{len(log.records)}", queue=LIMIT, emitted_at=0, source="op", max_running=1
    )
    log.add(at, event)


def permit(log: Log, at: int, action: str, job_id: str) -> int:
    step = QueuePermit(
        event_id=f"p{len(log.records)}", queue=LIMIT, job_id=job_id, action=action,
        emitted_at=0, source="node-1",
    )  # fmt: skip
    return log.add(at, step)


def upsert(log: Log, at: int, schedule_id: str, cron: str = "* * * * *") -> int:
    event = ScheduleUpserted(
        event_id=f"u{len(log.records)}", schedule_id=schedule_id, emitted_at=0, source="api",
        cron=cron, timezone="UTC", template=JobTemplate(task="t", queue="cron", args=b"[]"),
    )  # fmt: skip
    return log.add(at, event)


def fired(log: Log, at: int, schedule_id: str, fire_at: int = 60_000) -> int:
    event = ScheduleFired(
        event_id=f"f{len(log.records)}", schedule_id=schedule_id, emitted_at=0, source="mallory",
        fire_at=fire_at, job_id=f"{schedule_id}-{fire_at}",
    )  # fmt: skip
    return log.add(at, event)


def batchings(records: list[Record]) -> dict[str, list[int]]:
    """One record per batch, all in one, and batches of three (so some cross each boundary)."""
    size = len(records)
    return {"one": list(range(1, size)), "whole": [], "threes": list(range(3, size, 3))}


def permits(index: PartitionIndex) -> list[tuple[str, Verdict, int]]:
    """The limit's settings (queue timeline) and permit steps (their own), in log order."""
    stored = index.queue_timeline_events(LIMIT) + index.permit_timeline_events(LIMIT)
    return [(e.kind, e.verdict, e.log_at) for e, _ in sorted(stored, key=lambda s: s[0].offset)]


def schedule_kinds(index: PartitionIndex, schedule_id: str) -> list[tuple[str, Verdict]]:
    return [(e.kind, e.verdict) for e in index.timeline(schedule_id, schedule=True)]


def kept_days(index: PartitionIndex, schedule_id: str) -> list[bool]:
    """Per row of the schedule's audit, whether its reading says the entry expires."""
    found = audit(index, schedule_id)
    assert found is not None
    return ["the index keeps this entry for 7 days" in row.reading for row in found.rows]


def keys(index: PartitionIndex, family: str) -> int:
    return sum(1 for _ in index.scan(family))


def _permit_log() -> Log:
    """A limit set, one job's permit steps at 1_000, 2_000, 3_000 and a rejected second release."""
    log = Log()
    limit_set(log, 500)
    permit(log, 1_000, "request", "j1")
    permit(log, 2_000, "grant", "j1")
    permit(log, 3_000, "release", "j1")
    permit(log, 3_000, "release", "j1")  # rejected: holds no permit; expires all the same
    log.finished(4_000, "x", retention_ms=0)
    return log


def test_a_limits_permit_steps_go_at_the_first_purge_from_their_stated_time(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log = _permit_log()
    log.purge(1_000 + KEPT - 1, "x")  # a millisecond early: every step stays
    early = folded(tmp_path / "early", log.records, [], indexes)
    assert permits(early) == [
        ("QueueLimitSet", Verdict.APPLIED, 500),
        ("QueuePermit", Verdict.APPLIED, 1_000),
        ("QueuePermit", Verdict.APPLIED, 2_000),
        ("QueuePermit", Verdict.APPLIED, 3_000),
        ("QueuePermit", Verdict.REJECTED, 3_000),
    ]
    assert keys(early, ORPHANS) == 4
    limit = early.limit(LIMIT)

    log.finished(4_001, "y", retention_ms=0)
    log.purge(1_000 + KEPT, "y")  # the request's time: only the request goes
    log.finished(4_002, "z", retention_ms=0)
    log.purge(3_000 + KEPT, "z")  # the rest go; the limit's setting stays
    upto_y = len(log.records) - 3
    digests = set()
    for name, cuts in batchings(log.records).items():
        mid = folded(tmp_path / f"mid-{name}", log.records[:upto_y], cuts, indexes)
        assert [at for _, _, at in permits(mid)] == [500, 2_000, 3_000, 3_000], name
        index = folded(tmp_path / name, log.records, cuts, indexes)
        assert permits(index) == [("QueueLimitSet", Verdict.APPLIED, 500)], name
        assert keys(index, ORPHANS) == 0
        assert index.limit(LIMIT) == limit  # the state is the fold's, not the timeline's
        assert index.tallies() == early.tallies() | {"cancelled": 3}
        digests.add(index.digest())
    assert len(digests) == 1


def test_a_forged_fire_of_an_unknown_schedule_goes_and_an_existing_schedules_stays(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log = Log()
    fired(log, 1_000, "ghost")  # unknown: rejected, a mark of its own
    log.add(1_000, ScheduleDeleted(event_id="d", schedule_id="gone", emitted_at=0, source="x"))
    log.add(1_000, SchedulePaused(event_id="sp", schedule_id="later", emitted_at=0, source="x"))
    upsert(log, 1_001, "later")  # created after its rejected pause: that pause expires anyway
    upsert(log, 1_002, "real")
    fired(log, 1_003, "real", fire_at=1)  # rejected, of a schedule the index holds: stays
    upsert(log, 1_004, "real", cron="not a cron")  # rejected too: stays
    log.finished(2_000, "x", retention_ms=0)
    log.purge(1_000 + KEPT - 1, "x")
    before = folded(tmp_path / "before", log.records, [], indexes)
    assert schedule_kinds(before, "ghost") == [("ScheduleFired", Verdict.REJECTED)]
    assert keys(before, ORPHANS) == 3
    assert [kept_days(before, s) for s in ("ghost", "gone", "later", "real")] == [
        [True], [True], [True, False], [False, False, False]
    ]  # fmt: skip
    log.finished(2_001, "y", retention_ms=0)
    log.purge(1_000 + KEPT, "y")
    for name, cuts in batchings(log.records).items():
        index = folded(tmp_path / name, log.records, cuts, indexes)
        assert [schedule_kinds(index, s) for s in ("ghost", "gone")] == [[], []], name
        assert schedule_kinds(index, "later") == [("ScheduleUpserted", Verdict.APPLIED)]
        assert schedule_kinds(index, "real") == [
            ("ScheduleUpserted", Verdict.APPLIED),
            ("ScheduleFired", Verdict.REJECTED),
            ("ScheduleUpserted", Verdict.REJECTED),
        ]
        assert keys(index, ORPHANS) == 0
        assert index.schedule("real") == before.schedule("real")
        assert audit(index, "ghost") is None
    assert len({index.digest() for index in indexes[-3:]}) == 1


def _mixed_log() -> tuple[Log, int]:
    """Each kind of expiring entry, made between purges; and the offset of the first purge that
    expires the own marks (the records before it are a prefix where they are all kept)."""
    log = Log()
    limit_set(log, 0)
    log.finished(0, "a", retention_ms=10_000)
    log.purge(10_000, "a")  # a's mark is kept until 20_000
    log.cancel(15_000, "a")  # late: follows a's mark
    log.cancel(15_000, "ghost")  # never enqueued: a mark of its own until 15_000 + KEPT
    permit(log, 15_000, "request", "j1")  # the same
    fired(log, 15_000, "ghost-schedule")  # the same
    log.finished(19_000, "b", retention_ms=1_000)
    log.purge(20_000, "b")  # a's mark goes, and its follower; b's is kept until 21_000
    permit(log, 20_000, "grant", "j1")  # until 20_000 + KEPT
    log.finished(21_000, "c", retention_ms=0)
    log.purge(15_000 + KEPT - 1, "c")  # b's mark goes; the own marks stay
    log.finished(21_001, "d", retention_ms=0)
    first = log.purge(15_000 + KEPT, "d")  # the four own marks of 15_000 go
    log.cancel(15_000 + KEPT, "d")  # late: follows d's kept mark
    return log, first


def test_each_kind_goes_when_it_should_however_batched(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log, first = _mixed_log()
    kept = folded(tmp_path / "kept", log.records[:first], [], indexes)
    assert [e.log_at for e in kept.timeline("a")] == []  # went with a's mark
    assert [e.kind for e in kept.timeline("ghost")] == ["JobCancelled"]
    assert [at for kind, _, at in permits(kept) if kind == "QueuePermit"] == [15_000, 20_000]
    assert schedule_kinds(kept, "ghost-schedule") == [("ScheduleFired", Verdict.REJECTED)]
    assert (keys(kept, ORPHANS), keys(kept, FOLLOWERS)) == (4, 0)
    for name, cuts in batchings(log.records).items():
        index = folded(tmp_path / name, log.records, cuts, indexes)
        assert index.timeline("ghost") == [] and schedule_kinds(index, "ghost-schedule") == []
        assert [at for _, _, at in permits(index)] == [0, 20_000], name  # the setting and grant
        assert [e.kind for e in index.timeline("d")] == ["JobPurged", "JobCancelled"]
        assert (keys(index, ORPHANS), keys(index, FOLLOWERS)) == (1, 1), name
        [(key, value)] = index.scan(ORPHANS)
        assert (key[:8], value) == (orphan_key(20_000 + KEPT, 0)[:8], PERMIT_TIMELINE + b"mail")
    assert len({index.digest() for index in indexes[-3:]}) == 1


def test_every_prefix_folds_the_same_in_one_batch_or_one_record_at_a_time(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log, _ = _mixed_log()
    for end in range(1, len(log.records) + 1):
        prefix = log.records[:end]
        one = folded(tmp_path / f"one-{end}", prefix, list(range(1, end)), indexes)
        whole = folded(tmp_path / f"whole-{end}", prefix, [], indexes)
        assert whole.digest() == one.digest(), f"differs after offset {end - 1}"
        for index in (indexes.pop(), indexes.pop()):
            index.close()


def test_a_restored_index_expires_like_the_one_it_was_restored_from(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    """Restored from the changes as a changelog carries them, and from the mirrored keys as a
    compacted one does; then the records that expire every own mark fold the same into each."""
    log, first = _mixed_log()
    live = PartitionIndex(tmp_path / "live", 0)
    indexes.append(live)
    projector, written = Projector(live), []
    for start, end in itertools.pairwise((0, 5, first)):
        batch = projector.fold(log.records[start:end])
        prepared = projector.prepare(batch)
        assert prepared is not None
        written += prepared.changes
        projector.commit(batch, prepared)
    families = {key[:1] for f, key, v in written if f == "timeline" and v is None}
    assert families == {b"j"}  # a's entries, gone with its marks; the own marks are all kept
    values = {v[:1] for f, _, v in written if f == ORPHANS and v is not None}
    assert values == {b"j", PERMIT_TIMELINE, SCHEDULE_TIMELINE}
    for name, changes in (("log", written), ("compacted", list(live.mirrored()))):
        restored = PartitionIndex(tmp_path / name, 0)
        indexes.append(restored)
        restored.load(changes)
        restored.finish_load(live.applied_offset(), FOLD_VERSION)
        assert restored.digest() == live.digest()
    for index in indexes:
        fold_into(index, log.records[first:], [1])
    reference = folded(tmp_path / "one-batch", log.records, [], indexes)
    assert {index.digest() for index in indexes} == {reference.digest()}
    assert keys(reference, ORPHANS) == 1


def test_a_limited_jobs_permit_steps_cost_what_the_sizing_table_says(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    """docs/operations.md: about 920 bytes of index per limited job on its limit's home (the
    three steps' entries with their bytes, and their marks) until they expire; UUID job ids."""
    log, jobs = Log(), 50
    limit_set(log, 0)
    for n in range(jobs):
        job_id = f"10000000-0000-4000-8000-{n:012d}"
        for action in ("request", "grant", "release"):
            step = QueuePermit(
                event_id=ids.decision_event_id(job_id, f"permit-{action}-{LIMIT}-p3", 1_000 + n),
                queue=LIMIT, job_id=job_id, action=action, emitted_at=1_700_000_000_000,
                source="node-7f3a2b",
            )  # fmt: skip
            log.add(1_700_000_000_000 + n, step)
    set_only = folded(tmp_path / "set", log.records[:1], [], indexes)
    index = folded(tmp_path / "steps", log.records, [], indexes)
    sizes = [
        sum(len(k) + len(v) for f in (TIMELINE, ORPHANS) for k, v in i.scan(f))
        for i in (set_only, index)
    ]
    per_job = (sizes[1] - sizes[0]) / jobs
    assert [v for _, v, _ in permits(index)].count(Verdict.APPLIED) == 1 + 3 * jobs
    assert 860 <= per_job <= 950  # 890 here (queue "mail"), 918 for queue "default"
