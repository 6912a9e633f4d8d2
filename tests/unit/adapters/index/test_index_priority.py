"""The index's priority scan (``due_priority``) answers the due jobs in lease order, whatever the
order of writes and reads, skips held jobs within a bounded read, and is filled from ``due`` for
an index written before it existed and from the states after a changelog load."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from evsched.adapters.index.priority import BUILT, DUE_PRIORITY, priority_key, rank
from evsched.adapters.index.store import IndexBatch, PartitionIndex
from evsched.core.bounds import MAX_PRIORITY
from evsched.core.planner import due_order
from evsched.core.state import JobState, Status
from tests.states import job_state

BASE = job_state("j", args=b"[]")
JOB_IDS = [f"j{i}" for i in range(6)]
times = st.integers(min_value=0, max_value=60)
priorities = st.sampled_from([-MAX_PRIORITY, -3, 0, 1, 7, MAX_PRIORITY])

job_states = st.builds(
    lambda job_id, status, at, priority: dataclasses.replace(
        BASE,
        job_id=job_id,
        status=status,
        run_at=at,
        priority=priority,
        lease_until=at if status in (Status.LEASED, Status.RUNNING) else None,
        updated_at=at,
    ),
    st.sampled_from(JOB_IDS),
    st.sampled_from([Status.SCHEDULED, Status.LEASED, Status.SUCCEEDED]),
    times,
    priorities,
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.lists(job_states, max_size=3)),
        st.tuples(st.just("read"), times),
    ),
    max_size=40,
)


def in_lease_order(jobs: dict[str, JobState], now: int) -> list[str]:
    due = [s for s in jobs.values() if s.status is Status.SCHEDULED and s.run_at <= now]
    return [s.job_id for s in sorted(due, key=due_order)]


def write(index: PartitionIndex, known: dict[str, JobState], *states: JobState) -> None:
    batch = IndexBatch()
    for state in states:
        batch.before_jobs.setdefault(state.job_id, known.get(state.job_id))
        batch.jobs[state.job_id] = state
    index.write(batch, index.applied_offset() + 1, 1)
    known.update(batch.jobs)


@settings(max_examples=150, deadline=None)
@given(steps=steps)
def test_the_priority_scan_answers_the_due_jobs_in_lease_order(
    steps: list[tuple[str, object]],
) -> None:
    known: dict[str, JobState] = {}
    with tempfile.TemporaryDirectory() as tmp:
        index = PartitionIndex(Path(tmp) / "p0", 0)
        try:
            for kind, arg in steps:
                if kind == "write":
                    write(index, known, *arg)  # type: ignore[misc]
                    continue
                now = int(arg)  # type: ignore[call-overload]
                expected = in_lease_order(known, now)
                assert index.due_by_priority(now, 1) == expected[:1]  # a cut scan hides nothing
                assert index.due_by_priority(now, 100) == expected
        finally:
            index.close()


@settings(max_examples=100, deadline=None)
@given(steps=steps, queues=st.lists(st.sampled_from(["q", "other"]), min_size=6, max_size=6))
def test_the_entries_name_each_job_as_its_state_does(
    steps: list[tuple[str, object]], queues: list[str]
) -> None:
    """``due_entries`` reads what ``due_by_priority`` reads; an entry with a queue (none at a
    bound, where the key clamps) has the state's priority, run_at and queue."""
    queue_of = dict(zip(JOB_IDS, queues, strict=True))
    known: dict[str, JobState] = {}
    with tempfile.TemporaryDirectory() as tmp:
        index = PartitionIndex(Path(tmp) / "p0", 0)
        try:
            for kind, arg in steps:
                if kind == "write":
                    written: list[JobState] = arg  # type: ignore[assignment]
                    write(index, known, *(_on(s, queue_of[s.job_id]) for s in written))
                    continue
                now = int(arg)  # type: ignore[call-overload]
                entries = index.due_entries(now, 100)
                assert [e.job_id for e in entries] == in_lease_order(known, now)
                for entry in entries:
                    state = known[entry.job_id]
                    bound = state.run_at == 0 or abs(state.priority) == MAX_PRIORITY
                    assert entry.queue == ("" if bound else state.queue)
                    assert (entry.priority, entry.run_at) == (state.priority, state.run_at)
        finally:
            index.close()


def _on(state: JobState, queue: str) -> JobState:
    return dataclasses.replace(state, queue=queue)


def test_a_high_priority_job_is_found_behind_a_backlog_deeper_than_the_scan(
    tmp_path: Path,
) -> None:
    index = PartitionIndex(tmp_path / "p0", 0)
    known: dict[str, JobState] = {}
    try:
        lows = [dataclasses.replace(BASE, job_id=f"low{i:03d}", run_at=i) for i in range(300)]
        write(index, known, *lows)
        write(index, known, dataclasses.replace(BASE, job_id="high", run_at=500, priority=5))
        assert index.due_by_priority(1_000, 3) == ["high", "low000", "low001"]
        # A delayed job of a higher level costs one read, and does not stop the scan.
        write(index, known, dataclasses.replace(BASE, job_id="later", run_at=5_000, priority=9))
        assert index.due_by_priority(1_000, 2) == ["high", "low000"]
        assert index.due_by_priority(5_000, 1) == ["later"]
    finally:
        index.close()


def test_the_priority_scan_skips_held_jobs_within_a_bounded_read(tmp_path: Path) -> None:
    index = PartitionIndex(tmp_path / "p0", 0)
    try:
        states = [
            dataclasses.replace(BASE, job_id=f"h{i:02d}" if i < 25 else f"f{i:02d}", run_at=i)
            for i in range(30)
        ]
        write(index, {}, *states)

        def held(job_id: str) -> bool:
            return job_id.startswith("h")

        assert index.due_by_priority(100, 2, skip=held) == []  # 20 keys read at most: all held
        assert index.due_by_priority(100, 10, skip=held) == ["f25", "f26", "f27", "f28", "f29"]
    finally:
        index.close()


def test_an_index_from_before_the_family_is_filled_when_opened(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    index = PartitionIndex(path, 0)
    known: dict[str, JobState] = {}
    write(index, known, dataclasses.replace(BASE, job_id="a", run_at=1))
    write(index, known, dataclasses.replace(BASE, job_id="b", run_at=2, priority=3))
    write(index, known, dataclasses.replace(BASE, job_id="c", status=Status.SUCCEEDED))
    # Take the family and its mark away, as an index written by an older evsched has neither.
    for state in known.values():
        index._cf[DUE_PRIORITY].delete(priority_key(state.priority, state.run_at, state.job_id))
    index._cf["meta"].delete(BUILT)
    index.close()
    reopened = PartitionIndex(path, 0)
    try:
        assert reopened.due_by_priority(10, 10) == ["b", "a"]
        assert [e.queue for e in reopened.due_entries(10, 10)] == [BASE.queue] * 2
    finally:
        reopened.close()


def test_a_loaded_index_derives_the_family_from_the_states(tmp_path: Path) -> None:
    source = PartitionIndex(tmp_path / "src", 0)
    write(source, {}, dataclasses.replace(BASE, job_id="a", run_at=1))
    write(source, {}, dataclasses.replace(BASE, job_id="b", run_at=2, priority=3))
    changes = list(source.mirrored())
    source.close()
    target = PartitionIndex(tmp_path / "dst", 0)
    try:
        target.load(changes)
        target.finish_load(1, 1)
        assert target.due_by_priority(10, 10) == ["b", "a"]
        assert [e.queue for e in target.due_entries(10, 10)] == [BASE.queue] * 2
    finally:
        target.close()


def test_ranks_put_the_highest_priority_first_and_stay_in_range() -> None:
    assert rank(MAX_PRIORITY) == 0 < rank(1) < rank(0) < rank(-MAX_PRIORITY) == 2 * MAX_PRIORITY
    assert rank(MAX_PRIORITY + 5) == 0 and rank(-MAX_PRIORITY - 5) == 2 * MAX_PRIORITY
