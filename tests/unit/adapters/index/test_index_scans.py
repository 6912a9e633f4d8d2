"""Due, lease and cron scans start from a remembered low-water mark instead of the start of the
column family (which, after many deletes, is mostly tombstones). Whatever the order of writes and
reads, they must answer exactly what a scan over the live keys answers (cron slots share the
code path with due entries and leases)."""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from evsched.adapters.index.store import IndexBatch, PartitionIndex
from evsched.core import retention
from evsched.core.state import JobState, Status
from tests.states import job_state

BASE = job_state("j", args=b"[]")

JOB_IDS = [f"j{i}" for i in range(6)]
times = st.integers(min_value=0, max_value=60)

job_states = st.builds(
    lambda job_id, status, at: dataclasses.replace(
        BASE,
        job_id=job_id,
        status=status,
        run_at=at,
        lease_until=at if status in (Status.LEASED, Status.RUNNING) else None,
        updated_at=at,
        retention_ms=5,
    ),
    st.sampled_from(JOB_IDS),
    st.sampled_from([Status.SCHEDULED, Status.LEASED, Status.RUNNING, Status.SUCCEEDED]),
    times,
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.lists(job_states, max_size=3)),
        st.tuples(st.just("read"), times),
    ),
    max_size=40,
)


class Model:
    """What the index should hold: the newest state per job."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobState] = {}

    def due(self, now: int) -> list[str]:
        live = sorted((s.run_at, j) for j, s in self.jobs.items() if s.status is Status.SCHEDULED)
        return [j for at, j in live if at <= now]

    def expired(self, now: int) -> list[str]:
        live = sorted((s.lease_until, j) for j, s in self.jobs.items() if s.lease_until is not None)
        return [j for at, j in live if at <= now]

    def purgeable(self, now: int) -> list[str]:
        live = sorted((t, j) for j, s in self.jobs.items() if (t := retention.purge_at(s)))
        return [j for at, j in live if at <= now]

    def next_due_at(self, after: int) -> int | None:
        times = [s.run_at for s in self.jobs.values() if s.status is Status.SCHEDULED]
        times += [s.lease_until for s in self.jobs.values() if s.lease_until is not None]
        times += [t for s in self.jobs.values() if (t := retention.purge_at(s)) is not None]
        later = [t for t in times if t > after]
        return min(later) if later else None


@settings(max_examples=150, deadline=None)
@given(steps=steps)
def test_scans_answer_what_the_live_keys_say(steps: list[tuple[str, object]]) -> None:
    model = Model()
    with tempfile.TemporaryDirectory() as tmp:
        index = PartitionIndex(Path(tmp) / "p0", 0)
        try:
            offset = 0
            for kind, arg in steps:
                if kind == "write":
                    batch = IndexBatch()
                    for state in arg:  # type: ignore[attr-defined]
                        batch.before_jobs.setdefault(state.job_id, model.jobs.get(state.job_id))
                        batch.jobs[state.job_id] = state
                    index.write(batch, offset, 1)
                    offset += 1
                    model.jobs.update(batch.jobs)
                else:
                    now = int(arg)  # type: ignore[call-overload]
                    assert index.due_by_priority(now, 100) == model.due(now)
                    assert index.expired_lease_ids(now, 100) == model.expired(now)
                    assert index.due_purge_ids(now, 100) == model.purgeable(now)
                    assert index.next_due_at(after=now) == model.next_due_at(now)
                    # A limit cuts the earliest first, and a cut scan must not hide the rest.
                    assert index.due_by_priority(now, 1) == model.due(now)[:1]
                    assert index.due_by_priority(now, 100) == model.due(now)
        finally:
            index.close()


def test_a_due_scan_skips_held_jobs_within_a_bounded_read(tmp_path: Path) -> None:
    index = PartitionIndex(tmp_path / "p0", 0)
    try:
        batch = IndexBatch()
        for i in range(30):  # h00..h24 held, then f25..f29 free, all due in that order
            job_id = f"h{i:02d}" if i < 25 else f"f{i:02d}"
            batch.before_jobs[job_id] = None
            batch.jobs[job_id] = dataclasses.replace(BASE, job_id=job_id, run_at=i)
        index.write(batch, 0, 1)

        def held(job_id: str) -> bool:
            return job_id.startswith("h")

        assert index.due_by_priority(100, 2, skip=held) == []  # 20 keys read at most: all held
        assert index.due_by_priority(100, 10, skip=held) == ["f25", "f26", "f27", "f28", "f29"]
        assert index.due_by_priority(100, 2) == ["h00", "h01"]  # without skip: as before
    finally:
        index.close()
