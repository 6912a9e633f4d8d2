"""Earlier runs of a reused job id leave the index after their retention (``index_runs``), on a
real RocksDB: each at the first event at or after its end plus its retention, however the records
are batched; a restore from the mirrored families equals it, and audits refold the kept runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.adapters.index.keys import RUN_MARKS, RUNS
from evsched.adapters.index.store import PartitionIndex
from evsched.core.events import (
    AttemptStarted,
    AttemptSucceeded,
    JobEnqueued,
    JobLeased,
    JobPurged,
)
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Status, Verdict
from evsched.operator.audit import audit
from evsched.ports import Record
from tests.unit.adapters.index.test_index_orphans import Log
from tests.unit.index_folds import folded

KEPT_MS = 10_000


def keyed_run(log: Log, at: int, job_id: str = "k") -> int:
    """One run of a keyed job whose key window is 0: enqueued and cancelled at ``at``; the
    offset of its enqueue."""
    enqueue = JobEnqueued(
        event_id=f"e{len(log.records)}", job_id=job_id, emitted_at=0, source="test", task="t",
        queue="default", args=f"[{at}]".encode(), idempotency_key="key", key_window_ms=0,
        retention_ms=KEPT_MS,
    )  # fmt: skip
    offset = log.add(at, enqueue)
    log.cancel(at, job_id)
    return offset


def other(log: Log, at: int) -> int:
    """An event of another job at ``at``: only its log time matters here."""
    return log.cancel(at, "nobody")


def three_runs() -> tuple[Log, list[int]]:
    log = Log()
    starts = [keyed_run(log, 1_000), keyed_run(log, 2_000), keyed_run(log, 3_000)]
    return log, starts


def offsets(index: PartitionIndex, job_id: str = "k") -> list[int]:
    return [e.offset for e in index.timeline(job_id)]


def keys(index: PartitionIndex, family: str) -> int:
    return sum(1 for _ in index.scan(family))


def batchings(records: list[Record]) -> dict[str, list[int]]:
    size = len(records)
    return {"one": list(range(1, size)), "whole": [], "threes": list(range(3, size, 3))}


def test_an_earlier_run_leaves_at_the_first_event_from_its_end_plus_its_retention(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log, starts = three_runs()
    other(log, 1_000 + KEPT_MS - 1)  # a millisecond early: every run stays
    early = folded(tmp_path / "early", log.records, [], indexes)
    assert offsets(early) == [0, 1, 2, 3, 4, 5]
    assert early.run_base("k") is None  # nothing left: a refold starts from nothing

    other(log, 1_000 + KEPT_MS)  # run 0 ended at 1_000: it leaves, runs 1 and 2 stay
    index = folded(tmp_path / "one", log.records, [], indexes)
    assert offsets(index) == [starts[1], starts[1] + 1, starts[2], starts[2] + 1]
    base = index.run_base("k")
    assert base is not None and base[0] == starts[1]
    assert base[1].generation == 0 and base[1].status is Status.CANCELLED
    state = index.job("k")
    assert state is not None and state.generation == 2  # the job itself is untouched

    other(log, 3_000 + KEPT_MS)  # run 1 leaves too; the current run stays while it lives
    index = folded(tmp_path / "two", log.records, [], indexes)
    assert offsets(index) == [starts[2], starts[2] + 1]
    assert keys(index, RUNS) == 1 and keys(index, RUN_MARKS) == 0


def test_every_batching_makes_the_same_index_and_a_restore_equals_it(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log = Log()
    for at in range(1_000, 9_000, 1_000):
        keyed_run(log, at)
        other(log, at + KEPT_MS // 2)  # some runs leave between the next ones' events
    other(log, 7_500 + KEPT_MS)
    made = {
        name: folded(tmp_path / name, log.records, cuts, indexes)
        for name, cuts in batchings(log.records).items()
    }
    digests = {name: index.digest() for name, index in made.items()}
    assert len(set(digests.values())) == 1, digests
    whole = made["whole"]
    assert [e.kind for e in whole.timeline("k")] == ["JobEnqueued", "JobCancelled"]
    restored = PartitionIndex(tmp_path / "restored", 0)
    indexes.append(restored)
    restored.load(whole.mirrored())
    restored.finish_load(whole.applied_offset(), FOLD_VERSION)
    assert restored.digest() == whole.digest()


def test_an_audit_refolds_the_kept_runs_from_where_they_start(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log, starts = three_runs()
    other(log, 2_000 + KEPT_MS)
    index = folded(tmp_path / "a", log.records, [2], indexes)
    assert offsets(index) == [starts[2], starts[2] + 1]
    found = audit(index, "k")
    assert found is not None
    assert not found.drifted  # the enqueue refolds as run 2 of the id, as the fold judged it
    assert [row.entry.verdict for row in found.rows] == [Verdict.APPLIED, Verdict.APPLIED]
    assert isinstance(found.state, type(index.job("k"))) and found.state == index.job("k")


def held_run(log: Log) -> tuple[int, int]:
    """A unique (while queued) job re-enqueued while it runs: its success starts the held run.

    The offsets of the success and of the held run's next event."""

    def enqueue(at: int) -> JobEnqueued:
        return JobEnqueued(
            event_id=f"e{len(log.records)}", job_id="u", emitted_at=0, source="test", task="t",
            queue="default", args=b"[]", unique="queued", retention_ms=KEPT_MS,
        )  # fmt: skip

    log.add(1_000, enqueue(1_000))
    lease = JobLeased(
        event_id="l1", job_id="u", emitted_at=0, source="node", token=1, attempt=1, lease_ms=60_000
    )
    log.add(1_000, lease)
    start = AttemptStarted(
        event_id="s1", job_id="u", emitted_at=0, source="w", token=1, worker_id="w", lease_ms=60_000
    )
    log.add(1_100, start)
    log.add(1_200, enqueue(1_200))  # held until run 0 ends
    done = AttemptSucceeded(
        event_id="d1", job_id="u", emitted_at=0, source="w", token=1, result=b"1"
    )
    ended = log.add(2_000, done)  # ends run 0 and begins run 1
    lease = JobLeased(
        event_id="l2", job_id="u", emitted_at=0, source="node", token=2, attempt=1, lease_ms=60_000
    )
    return ended, log.add(2_500, lease)


@pytest.mark.parametrize("cuts", [[], [5], [1, 2, 3, 4, 5, 6, 7]])
def test_the_event_that_ends_a_run_for_a_held_one_stays_with_the_ended_run(
    tmp_path: Path, indexes: list[PartitionIndex], cuts: list[int]
) -> None:
    log = Log()
    ended, next_lease = held_run(log)
    other(log, 2_000 + KEPT_MS - 1)
    kept = folded(tmp_path / "kept", log.records, cuts, indexes)
    assert offsets(kept, "u") == [0, 1, 2, 3, ended, next_lease]

    other(log, 2_000 + KEPT_MS)  # run 0 ended with the success at 2_000
    index = folded(tmp_path / "gone", log.records, cuts, indexes)
    assert offsets(index, "u") == [next_lease]
    found = audit(index, "u")
    assert found is not None and not found.drifted
    state = index.job("u")
    assert state is not None and state.generation == 1 and state.status is Status.LEASED
    assert found.state == state


def test_a_purge_of_the_id_takes_its_run_entries_and_a_new_life_of_it_starts_afresh(
    tmp_path: Path, indexes: list[PartitionIndex]
) -> None:
    log, _ = three_runs()
    other(log, 1_000 + KEPT_MS)  # run 0 leaves; runs 1 and 2 stay
    purge = JobPurged(event_id="p", job_id="k", emitted_at=0, source="node", generation=2)
    purged = log.add(3_000 + KEPT_MS, purge)  # run 2 ended at 3_000: the id goes
    again = keyed_run(log, 3_000 + KEPT_MS + 1)
    for name, cuts in batchings(log.records).items():
        index = folded(tmp_path / name, log.records, cuts, indexes)
        assert offsets(index) == [purged, again, again + 1], name
        assert keys(index, RUNS) == 0 and keys(index, RUN_MARKS) == 0, name
        assert index.run_base("k") is None
        state = index.job("k")
        assert state is not None and state.generation == 0
