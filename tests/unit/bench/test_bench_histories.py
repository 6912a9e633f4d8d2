"""The generated histories' purges (bench/history_purges.py) and bench/restore.py's snapshot,
without a broker: the node's purges, applied by the fold, the same log as before without a
retention, and a take-over restored from the live keys only to a full fold's digest."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from evsched.adapters import avro
from evsched.adapters.index.keys import JOBS, MARKS, TIMELINE
from evsched.adapters.index.store import PartitionIndex
from evsched.core import planner, retention
from evsched.core.events import JobEnqueued, JobPurged, Position
from evsched.core.fold import fold
from evsched.core.state import JobState, Verdict
from evsched.runtime.projection.changelog import JOB_RECORD
from evsched.runtime.projection.changelog_restore import restore_partition
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import restore
from evsched.testing import MemoryPartitionLog

BENCH = Path(__file__).resolve().parents[3] / "bench"
# Appended, not prepended: bench/ holds modules (fold.py, audit.py) that must shadow nothing.
sys.path.append(str(BENCH))
histories: Any = importlib.import_module("histories")
restore_bench: Any = importlib.import_module("restore")

# The summary of Generator(jobs=2_000, partitions=3, seed=11) before retention existed in it.
WITHOUT_RETENTION = "c7d0d000ae39f4ace31a881b772bc73ed3b211d30eeb062a4f9dab34b262d63c"
# A job every 10 ms: a job runs for about 1.3 s, so most of the jobs are finished, not in flight.
GAP_MS = 10


def summary(events: Any) -> str:
    digest = hashlib.sha256()
    for partition, at, event in events:
        kind = type(event).__name__
        digest.update(f"{partition} {at} {kind} {event.job_id} {event.event_id}\n".encode())
    return digest.hexdigest()


def test_without_a_retention_the_log_is_what_it_was() -> None:
    generator = histories.Generator(jobs=2_000, partitions=3, seed=11)
    assert generator.purger is None
    assert summary(generator.events()) == WITHOUT_RETENTION


def test_purges_leave_the_jobs_and_their_fates_as_they_were() -> None:
    kept = histories.Generator(jobs=1_000, partitions=3, seed=11, gap_ms=GAP_MS, retention_ms=300)
    purges, others = [], []
    for partition, at, event in kept.events():
        if isinstance(event, JobPurged):
            purges.append(event)
        elif isinstance(event, JobEnqueued):
            assert event.retention_ms == 300  # as a client stamps its namespace's retention
            others.append((partition, at, replace(event, retention_ms=None)))
        else:
            others.append((partition, at, event))
    plain = histories.Generator(jobs=1_000, partitions=3, seed=11, gap_ms=GAP_MS)
    assert others == list(plain.events())
    assert len(purges) == kept.purger.purged > 700


def test_the_same_seed_gives_the_same_log_with_purges() -> None:
    def log(seed: int) -> list[Any]:
        return list(
            histories.Generator(jobs=300, partitions=2, seed=seed, retention_ms=0).records()
        )

    assert log(5) == log(5) != log(6)


def test_each_purge_is_the_planners_when_due_and_the_fold_applies_it() -> None:
    generator = histories.Generator(
        jobs=1_500, partitions=2, seed=3, gap_ms=GAP_MS, retention_ms=1_000
    )
    states: dict[str, JobState] = {}
    offsets = {0: 0, 1: 0}
    last_at = {0: 0, 1: 0}
    applied = set()
    for record in generator.records():
        assert record.log_at >= last_at[record.partition]  # log order
        last_at[record.partition] = record.log_at
        event = avro.decode_event(record.value)
        before = states.get(event.job_id)
        offset = offsets[record.partition]
        position = Position(partition=record.partition, offset=offset, log_at=record.log_at)
        offsets[record.partition] += 1
        after, entry = fold(before, event, position)
        if isinstance(event, JobPurged) and event.event_id not in applied:
            assert before is not None
            planned = planner.plan_purges([before], now=record.log_at, source="node-1")
            assert planned == [event]
            assert entry.verdict is Verdict.APPLIED and after is None
            assert retention.purge_at(before) == record.log_at  # planned as soon as due
            applied.add(event.event_id)
        if after is None:
            states.pop(event.job_id, None)
        else:
            states[event.job_id] = after
    assert len(applied) == generator.purger.purged > 1_000
    end = max(last_at.values())
    for state in states.values():  # what is left was not due yet when the log ended
        due = retention.purge_at(state)
        assert due is None or due > end


async def test_a_take_over_restores_the_live_keys_only_to_a_full_folds_digest(
    tmp_path: Path,
) -> None:
    generator = histories.Generator(
        jobs=1_200, partitions=1, seed=2, gap_ms=GAP_MS, retention_ms=500
    )
    events = MemoryPartitionLog("ns.events")
    for record in generator.records():
        events.append(0, record.value, key=record.key, log_at=record.log_at)
    await events.start()
    end = len(events.entries[0])
    full = await folded(events, tmp_path / "full", end)
    snapshot = await folded(events, tmp_path / "snapshot", end - 200)
    try:
        records, families = restore_bench.changelog_records(snapshot, "ns.state")
        live = [state.job_id for state in snapshot.jobs()]
        assert len(live) < 400  # of 1,200 jobs: most of them are purged
        purged = [job for job in {e.job_id for e in purges(events, end - 200)} if job not in live]
        assert len(purged) > 700
        kept = 0
        remembered = 0  # purged jobs with entries left: a record each
        for job_id in purged:
            # The purge's own entry, kept for audits until its mark ends; after it, only what
            # came too late for the job (rejected: no such job).
            entries = snapshot.timeline(job_id)
            applied = [e.kind for e in entries if e.verdict is Verdict.APPLIED]
            assert applied in (["JobPurged"], [])
            assert len(entries) - len(applied) == sum(
                e.verdict is Verdict.REJECTED for e in entries
            )
            kept += len(applied)
            remembered += bool(entries)
        assert kept == families[MARKS] > 0
        # A record per job (its state and timeline); no job's entry is a record of its own.
        assert families[JOB_RECORD] == len(live) + remembered
        assert JOBS not in families and TIMELINE not in families
        assert len(records) < end / 8
    finally:
        snapshot.close()
    state = MemoryPartitionLog("ns.state")
    for record in records:
        state.append(0, record.value, key=record.key)
    await state.start()
    meta = await restore_partition(state, tmp_path / "takeover", 0, log_start=0)
    assert meta.applied_offset == end - 201
    taken = PartitionIndex(tmp_path / "takeover" / "p0000", 0)
    try:
        assert await restore(events, {0: Projector(taken)}, {0: end}) == 200
        assert taken.digest() == full.digest()
    finally:
        taken.close()
        full.close()


async def folded(events: MemoryPartitionLog, directory: Path, until: int) -> PartitionIndex:
    index = PartitionIndex(directory, 0)
    await restore(events, {0: Projector(index)}, {0: until})
    return index


def purges(events: MemoryPartitionLog, until: int) -> list[JobPurged]:
    found = []
    for record in events.entries[0][:until]:
        assert record is not None and record.value is not None
        event = avro.decode_event(record.value)
        if isinstance(event, JobPurged):
            found.append(event)
    return found


@pytest.mark.parametrize(("text", "value"), [("off", None), ("0", 0), ("60000", 60_000)])
def test_the_retention_option(text: str, value: int | None) -> None:
    assert restore_bench.retention(text) == value


@pytest.mark.parametrize("text", ["-1", "1m", ""])
def test_a_bad_retention_option_says_what_it_takes(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="milliseconds nor off"):
        restore_bench.retention(text)
