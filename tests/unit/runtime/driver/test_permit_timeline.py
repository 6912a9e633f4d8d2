"""A limit's permit steps live on a timeline of their own (fold version 7), on a real RocksDB: the
readers of a queue's pauses and limit settings (time travel's ``paused_in``, the ``--wait``
check after a pause or limit write) decode those alone, however many steps the limit's home has.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.adapters.index.keys import PERMIT_TIMELINE, QUEUE_TIMELINE, TIMELINE, timeline_key
from evsched.adapters.index.store import PartitionIndex
from evsched.core.controls import QUEUE
from evsched.core.events import QueueLimitSet, QueuePaused, QueuePermit
from evsched.core.state import TimelineEntry, Verdict
from evsched.operator.replica_dir import LocalIndex
from evsched.operator.writes import Judged, judge
from evsched.ports import Appended
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.refold import paused_in
from tests.unit.adapters.index.test_index_orphans import Log

LIMIT = "mail"  # the queue and its limit: one name, so one prefix of the queue timeline
JOBS = 1_000  # three permit steps each


@pytest.fixture
def busy_home(tmp_path: Path) -> Iterator[tuple[PartitionIndex, int, int]]:
    """A limit's home with its setting, ``JOBS`` jobs' permit steps and then a pause of the queue;
    with the offsets of the setting and of the pause."""
    log = Log()
    setting = log.add(0, QueueLimitSet(event_id="l", queue=LIMIT, emitted_at=0, source="op",
                                       max_running=1))  # fmt: skip
    for n in range(JOBS):
        for action in ("request", "grant", "release"):
            step = QueuePermit(event_id=f"{action}{n}", queue=LIMIT, job_id=f"j{n}",
                               action=action, emitted_at=0, source="node-1")  # fmt: skip
            log.add(1_000 + n, step)
    pause = log.add(5_000, QueuePaused(event_id="p", queue=LIMIT, emitted_at=0, source="op"))
    index = PartitionIndex(tmp_path / "home", 0)
    projector = Projector(index)
    projector.commit(projector.fold(log.records))
    yield index, setting, pause
    index.close()


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kinds of the timeline entries the index decodes from here on."""
    kinds: list[str] = []
    decode = avro.decode_timeline

    def counted(data: bytes) -> TimelineEntry:
        entry = decode(data)
        kinds.append(entry.kind)
        return entry

    monkeypatch.setattr(avro, "decode_timeline", counted)
    return kinds


def stored_keys(index: PartitionIndex, family: bytes) -> int:
    prefix = timeline_key(LIMIT, 0, family=family)[:-8]
    return sum(1 for key, _ in index.scan(TIMELINE, prefix) if key.startswith(prefix))


def test_the_steps_are_kept_apart_from_the_pause_and_the_setting(
    busy_home: tuple[PartitionIndex, int, int],
) -> None:
    index, setting, pause = busy_home
    assert stored_keys(index, PERMIT_TIMELINE) == 3 * JOBS
    assert stored_keys(index, QUEUE_TIMELINE) == 2
    queue = [(e.offset, e.kind, e.verdict) for e, _ in index.queue_timeline_events(LIMIT)]
    assert queue == [
        (setting, "QueueLimitSet", Verdict.APPLIED),
        (pause, "QueuePaused", Verdict.APPLIED),
    ]
    steps = index.permit_timeline_events(LIMIT)
    assert [e.offset for e, _ in steps] == list(range(setting + 1, pause))
    assert {(e.kind, e.verdict) for e, _ in steps} == {("QueuePermit", Verdict.APPLIED)}


def test_time_travel_decodes_the_pause_and_the_setting_only(
    busy_home: tuple[PartitionIndex, int, int], decoded: list[str]
) -> None:
    index, _, pause = busy_home
    paused = paused_in(index)
    assert not paused(QUEUE, LIMIT, pause) and paused(QUEUE, LIMIT, pause + 1)
    assert sorted(decoded) == ["QueueLimitSet", "QueuePaused"]  # none of the 3,000 steps


def test_the_wait_check_of_a_pause_decodes_the_pause_and_the_setting_only(
    busy_home: tuple[PartitionIndex, int, int], decoded: list[str]
) -> None:
    index, _, pause = busy_home
    appended = Appended(topic="events", partition=0, offset=pause)
    written = Judged(entity_id=LIMIT, kind="QueuePaused", appended=appended)
    [judged] = judge(LocalIndex(indexes={0: index}), [written])
    assert judged.verdict is Verdict.APPLIED and judged.reading
    assert sorted(decoded) == ["QueueLimitSet", "QueuePaused"]
