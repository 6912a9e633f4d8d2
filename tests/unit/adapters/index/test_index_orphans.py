"""Rejected events of jobs the index does not hold (fold version 6): each expires from the log at
a stated log time, whatever the batching, and a restore from the mirrored families equals it.

The logs here are written by hand with chosen log times, so each expiry is checked to the
millisecond: a purge mark's followers go at the first applied purge at or after the mark's time,
every other orphan at the first applied purge at or after its log time plus
``retention.ORPHAN_KEPT_MS``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.adapters.index.keys import FOLLOWERS, MARKS, ORPHANS
from evsched.adapters.index.store import PartitionIndex
from evsched.core import retention
from evsched.core.events import (
    Event,
    JobCancelled,
    JobEnqueued,
    JobPurged,
    PermitRequested,
    entity_id,
)
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Verdict
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector

KEPT = retention.ORPHAN_KEPT_MS


class Log:
    """Records of one partition, each at the log time the test names."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def add(self, at: int, event: Event) -> int:
        offset = len(self.records)
        value = avro.encode_event(event)
        self.records.append(Record("events", 0, offset, at, entity_id(event).encode(), value))
        return offset

    def _id(self) -> str:
        return f"e{len(self.records)}"

    def finished(self, at: int, job_id: str, retention_ms: int) -> None:
        """A job enqueued and cancelled at ``at``: finished, purgeable from ``at + retention``."""
        enqueue = JobEnqueued(
            event_id=self._id(), job_id=job_id, emitted_at=0, source="test", task="t",
            queue="default", args=b"[]", retention_ms=retention_ms,
        )  # fmt: skip
        self.add(at, enqueue)
        self.cancel(at, job_id)

    def cancel(self, at: int, job_id: str) -> int:
        return self.add(
            at, JobCancelled(event_id=self._id(), job_id=job_id, emitted_at=0, source="test")
        )

    def purge(self, at: int, job_id: str) -> int:
        purge = JobPurged(
            event_id=self._id(), job_id=job_id, emitted_at=0, source="test", generation=0
        )
        return self.add(at, purge)


def folded(
    path: Path, records: list[Record], batch: int, opened: list[PartitionIndex]
) -> Projector:
    index = PartitionIndex(path, 0)
    opened.append(index)
    projector = Projector(index)
    for start in range(0, len(records), batch):
        projector.commit(projector.fold(records[start : start + batch]))
    return projector


def kinds(index: PartitionIndex, job_id: str) -> list[tuple[str, Verdict]]:
    return [(e.kind, e.verdict) for e in index.timeline(job_id)]


def keys(index: PartitionIndex, family: str) -> int:
    return sum(1 for _ in index.scan(family))


def test_an_unknown_jobs_rejected_event_goes_at_the_first_purge_from_its_stated_time(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log = Log()
    log.cancel(1_000, "ghost")  # never enqueued: rejected, kept until 1_000 + KEPT
    log.finished(2_000, "x", retention_ms=0)
    log.purge(1_000 + KEPT - 1, "x")  # a purge a millisecond early: the ghost stays
    index = folded(tmp_path / "a", log.records, 1, indexes).index
    assert kinds(index, "ghost") == [("JobCancelled", Verdict.REJECTED)]
    assert keys(index, ORPHANS) == 1

    log.finished(2_000, "y", retention_ms=0)
    log.purge(1_000 + KEPT, "y")  # the first purge at the stated time: the ghost goes
    index = folded(tmp_path / "b", log.records, 1, indexes).index
    assert kinds(index, "ghost") == []
    assert keys(index, ORPHANS) == 0
    assert retention.orphan_until(1_000) == 1_000 + KEPT == 1_000 + retention.DEFAULT_RETENTION_MS


def test_a_permit_step_for_an_unknown_job_expires_too(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log = Log()
    ask = PermitRequested(event_id="p1", job_id="ghost", emitted_at=0, source="x", queue="q")
    log.add(1_000, ask)
    index = folded(tmp_path / "kept", log.records, 1, indexes).index
    assert kinds(index, "ghost") == [("PermitRequested", Verdict.REJECTED)]
    log.finished(2_000, "x", retention_ms=0)
    log.purge(1_000 + KEPT, "x")
    index = folded(tmp_path / "gone", log.records, 1, indexes).index
    assert kinds(index, "ghost") == [] and keys(index, ORPHANS) == 0


def _late_events_log() -> Log:
    """A purge mark followed by late events, expiring; then a late event past it, and ghosts."""
    log = Log()
    log.cancel(0, "a")  # before a's enqueue: an orphan of its own, whose entry a's purge drops
    log.finished(0, "a", retention_ms=10_000)
    log.purge(10_000, "a")  # applied: a's mark is kept until 20_000
    log.cancel(15_000, "a")  # late: follows the mark
    log.purge(15_000, "no-such-job")  # forged: a mark of its own
    log.cancel(15_001, "a")
    log.finished(16_000, "b", retention_ms=3_999)
    log.purge(19_999, "b")  # before a's mark time: a keeps its purge and both late events
    log.finished(19_999, "c", retention_ms=1)
    log.purge(20_000, "c")  # a's mark (20_000) and its followers go; b's (23_998) stays
    log.cancel(20_001, "a")  # after the mark: an orphan of its own
    log.finished(20_002, "d", retention_ms=0)
    log.purge(20_002, "d")
    return log


def test_late_events_of_a_purged_job_go_with_its_purge_mark(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log = _late_events_log()
    upto_b = next(r.offset for r in log.records if r.log_at == 19_999 and r.key == b"b")
    early = folded(tmp_path / "early", log.records[: upto_b + 1], 1, indexes).index
    assert kinds(early, "a") == [
        ("JobPurged", Verdict.APPLIED),
        ("JobCancelled", Verdict.REJECTED),
        ("JobCancelled", Verdict.REJECTED),
    ]
    assert keys(early, FOLLOWERS) == 2  # a's two late events
    assert keys(early, ORPHANS) == 2  # no-such-job's, and the one a's purge dropped

    index = folded(tmp_path / "all", log.records, 1, indexes).index
    [late] = index.timeline("a")
    assert (late.kind, late.log_at, late.verdict) == ("JobCancelled", 20_001, Verdict.REJECTED)
    assert keys(index, FOLLOWERS) == 0
    assert keys(index, ORPHANS) == 3  # and a's last late event: each for KEPT
    assert kinds(index, "no-such-job") == [("JobPurged", Verdict.REJECTED)]


@pytest.mark.parametrize("batch", [4, 1000])
def test_every_batching_makes_the_same_index_and_a_restore_equals_it(
    tmp_path: Path, indexes: list[PartitionIndex], batch: int
) -> None:
    log = _late_events_log()
    log.purge(20_003 + KEPT, "d")  # rejected (purged already): follows d's kept mark
    log.finished(20_004 + KEPT, "e", retention_ms=0)
    log.purge(20_004 + KEPT, "e")  # every own mark and d's are due by now
    log.cancel(20_005 + KEPT, "e")  # follows e's kept mark
    log.cancel(20_005 + KEPT, "zz")  # a mark of its own
    one = folded(tmp_path / "one", log.records, 1, indexes).index
    many = folded(tmp_path / f"b{batch}", log.records, batch, indexes).index
    assert many.digest() == one.digest()
    assert [kinds(one, job) for job in ("a", "no-such-job", "d")] == [[], [], []]
    assert (keys(one, ORPHANS), keys(one, FOLLOWERS), keys(one, MARKS)) == (1, 1, 1)
    assert kinds(one, "e") == [("JobPurged", Verdict.APPLIED), ("JobCancelled", Verdict.REJECTED)]

    restored = PartitionIndex(tmp_path / f"restored-{batch}", 0)
    indexes.append(restored)
    restored.load(many.mirrored())
    restored.finish_load(many.applied_offset(), FOLD_VERSION)
    assert restored.digest() == one.digest()


def test_every_prefix_folds_the_same_in_one_batch_or_one_record_at_a_time(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log = _late_events_log()
    for end in range(1, len(log.records) + 1):
        prefix = log.records[:end]
        one = folded(tmp_path / f"one-{end}", prefix, 1, indexes).index
        whole = folded(tmp_path / f"whole-{end}", prefix, 1000, indexes).index
        assert whole.digest() == one.digest(), f"differs after offset {end - 1}"
        for index in (indexes.pop(), indexes.pop()):
            index.close()
