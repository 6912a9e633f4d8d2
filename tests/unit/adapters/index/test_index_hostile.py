"""Issue 9 A.1 and E.16 on a real RocksDB: whatever the fold judged, the index can write it.

A refused event whose id cannot key a timeline (70 kB, empty) is kept in the ``refused`` family by
offset; a schedule and a job sharing an id keep separate timelines.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.core import bounds
from evsched.core import events as ev
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Verdict
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector
from tests.strategies import EVENT_STRATEGIES, records

T0 = 1_735_689_600_000
_offsets = itertools.count()


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PartitionIndex]:
    idx = PartitionIndex(tmp_path / "p0", 0)
    yield idx
    idx.close()


def fold_events(index: PartitionIndex, *events: ev.Event, at: int = T0) -> None:
    start = index.applied_offset() + 1
    log = [
        Record("t.events", 0, start + i, at + i, b"k", avro.encode_event(event))
        for i, event in enumerate(events)
    ]
    projector = Projector(index)
    projector.commit(projector.fold(log))


def enqueued(job_id: str, **kw: object) -> ev.JobEnqueued:
    return ev.JobEnqueued(
        event_id=f"e{next(_offsets)}",
        job_id=job_id,
        emitted_at=0,
        source="client",
        task="t",
        queue="q",
        args=b"[]",
        **kw,  # type: ignore[arg-type]
    )


def test_a_refused_event_with_a_70kb_job_id_is_written_and_audited_by_offset(
    index: PartitionIndex,
) -> None:
    """Before: the 2-byte length prefix raised struct.error and the partition's step failed."""
    huge = "j" * 70_000
    fold_events(index, enqueued(huge), enqueued("ok"))
    assert index.applied_offset() == 1
    ((entry, raw),) = index.refused()
    assert (entry.offset, entry.verdict, entry.kind) == (0, Verdict.REJECTED, "JobEnqueued")
    assert entry.reason == "job_id has 70000 UTF-8 bytes, above the limit of 1024"
    assert avro.decode_event(raw).job_id == huge  # type: ignore[union-attr]
    assert index.timeline(huge) == [] and index.job(huge) is None
    assert [e.verdict for e in index.timeline("ok")] == [Verdict.APPLIED]


def test_a_schedule_id_equal_to_a_job_id_keeps_two_timelines(index: PartitionIndex) -> None:
    """Issue 9 E.16: the job's audit showed the schedule's events and the other way round."""
    upsert = ev.ScheduleUpserted(
        event_id="u",
        schedule_id="same",
        emitted_at=0,
        source="api",
        cron="*/5 * * * *",
        timezone="UTC",
        template=ev.JobTemplate(task="t", queue="q", args=b"[]"),
    )
    fold_events(index, enqueued("same"), upsert)
    assert [e.kind for e in index.timeline("same", schedule=False)] == ["JobEnqueued"]
    assert [e.kind for e in index.timeline("same", schedule=True)] == ["ScheduleUpserted"]
    assert [e.kind for e in index.timeline("same")] == ["JobEnqueued"]
    fold_events(
        index, ev.ScheduleDeleted(event_id="d", schedule_id="only", emitted_at=0, source="a")
    )
    assert [e.kind for e in index.timeline("only")] == ["ScheduleDeleted"]


# Ids near and beyond the limit, and every numeric edge a forged event may carry.
_ids = st.sampled_from(["", "j", "é" * 512, "é" * 513, "x" * 70_000, "j\x00k"])
_hostile = {
    "job_id": _ids,
    "event_id": st.sampled_from(["e", "", "e" * 1025]),
}
_schedule = {"schedule_id": _ids, "event_id": st.sampled_from(["e", "", "e" * 1025])}


_queue = {
    "queue": st.sampled_from(["q", "", "bad queue!", "q" * 201, "x" * 70_000]),
    "event_id": st.sampled_from(["e", "", "e" * 1025]),
}


def _strategy(cls: type[ev.Event]) -> st.SearchStrategy[ev.Event]:
    hostile = _hostile
    if cls in (*ev.SCHEDULE_EVENT_TYPES, ev.SchedulePaused, ev.ScheduleResumed):
        hostile = _schedule
    elif cls in (ev.QueuePaused, ev.QueueResumed, ev.QueueLimitSet):
        hostile = _queue
    elif cls is ev.KeyLimitSet:
        hostile = {"key": _queue["queue"], "event_id": _queue["event_id"]}
    elif cls in (*ev.PERMIT_EVENT_TYPES, ev.QueuePermit):
        hostile = {**_hostile, "queue": _queue["queue"]}
    return records(cls, **hostile) | EVENT_STRATEGIES[cls]


_events = st.one_of(*(_strategy(cls) for cls in ev.EVENT_TYPES))
_times = st.integers(min_value=0, max_value=bounds.MAX_TIME_MS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(st.tuples(_events, _times), min_size=1, max_size=8))
def test_any_event_the_fold_judges_can_be_written_to_the_index(
    tmp_path_factory: pytest.TempPathFactory, history: list[tuple[ev.Event, int]]
) -> None:
    """Property: folding any events (forged ids, numbers at any edge) never fails the write."""
    index = PartitionIndex(tmp_path_factory.mktemp("idx"), 0)
    try:
        projector = Projector(index)
        log = []
        for offset, (event, at) in enumerate(history):
            try:
                value = avro.encode_event(event)
            except Exception:  # what cannot be written cannot reach the fold either
                continue
            log.append(Record("t.events", 0, offset, at, b"k", value))
        if not log:
            return
        projector.commit(projector.fold(log))
        assert index.applied_offset() == log[-1].offset
        assert index.fold_version() == FOLD_VERSION
        index.digest()
    finally:
        index.close()
