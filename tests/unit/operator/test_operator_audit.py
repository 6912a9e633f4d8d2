"""Audits read a job's timeline from the index, refold it, and read every verdict out in words;
``--as-of`` folds the stored bytes up to an offset (time travel), without a log scan."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.core import events as ev
from evsched.core.state import JobState, ScheduleState, Status, Verdict
from evsched.operator.audit import audit
from evsched.operator.readings import iso, span
from evsched.ports import Record
from evsched.runtime.projection.projector import Projector

T0 = 1_767_225_600_000
_ids = itertools.count()


def _meta(job: str, source: str) -> dict[str, Any]:
    return {"event_id": f"e{next(_ids)}", "job_id": job, "emitted_at": 0, "source": source}


def enq(job: str, **kw: Any) -> ev.JobEnqueued:
    fields: dict[str, Any] = {"task": "billing.send", "queue": "default", "args": b"[]", **kw}
    return ev.JobEnqueued(**_meta(job, kw.pop("source", "client")), **fields)


def lease(job: str, token: int, attempt: int, lease_ms: int = 5_000) -> ev.JobLeased:
    return ev.JobLeased(**_meta(job, "node-1"), token=token, attempt=attempt, lease_ms=lease_ms)


def start(job: str, token: int, worker: str = "worker-3") -> ev.AttemptStarted:
    return ev.AttemptStarted(**_meta(job, worker), token=token, worker_id=worker, lease_ms=2_000)


def ok(job: str, token: int, worker: str = "worker-3") -> ev.AttemptSucceeded:
    effect = ev.Effect(kind="mail", payload=b"{}")
    return ev.AttemptSucceeded(**_meta(job, worker), token=token, result=b"1", effects=(effect,))


def fail(job: str, token: int, *, retryable: bool = True) -> ev.AttemptFailed:
    return ev.AttemptFailed(
        **_meta(job, "worker-3"),
        token=token,
        error_type="ConnectionError",
        message="reset by peer",
        retryable=retryable,
    )


def expire(job: str, token: int) -> ev.LeaseExpired:
    return ev.LeaseExpired(**_meta(job, "node-1"), token=token)


def cancel(job: str) -> ev.JobCancelled:
    return ev.JobCancelled(**_meta(job, "client"), reason="not needed")


class Story:
    """One partition's log, event by event, each a few milliseconds after the last."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.at = T0

    def add(self, event: ev.Event | bytes, after_ms: int = 10) -> int:
        self.at += after_ms
        value = event if isinstance(event, bytes) else avro.encode_event(event)
        key = b"x" if isinstance(event, bytes) else ev.entity_id(event).encode()
        offset = len(self.records)
        self.records.append(Record("t.events", 0, offset, self.at, key, value))
        return offset

    def index(self, path: Path) -> PartitionIndex:
        index = PartitionIndex(path, 0)
        projector = Projector(index)
        projector.commit(projector.fold(self.records))
        return index


@pytest.fixture
def index_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "p0000"


def zombie_story() -> Story:
    """Token 1 expires unstarted; token 2 starts on worker-3, expires, token 3 reruns; worker-3's
    late success is stale. Tokens run one ahead of attempts, so a reading cannot mix them up."""
    story = Story()
    story.add(enq("job"))
    story.add(lease("job", 1, 1))
    story.add(expire("job", 1), after_ms=5_000)  # no worker came: no attempt spent
    story.add(lease("job", 2, 1))
    story.add(start("job", 2))
    story.add(expire("job", 2), after_ms=2_500)
    story.add(lease("job", 3, 2), after_ms=1_500)
    story.add(start("job", 3, worker="worker-7"))
    story.add(ok("job", 2))
    story.add(ok("job", 3, worker="worker-7"))
    story.add(ok("job", 3, worker="worker-7"))  # the current token, but the job is done
    return story


def test_a_zombie_completion_reads_as_stale_naming_both_tokens(index_dir: Path) -> None:
    index = zombie_story().index(index_dir)
    found = audit(index, "job")
    index.close()

    assert found is not None
    readings = [(row.entry.kind, row.entry.verdict, row.reading) for row in found.rows]
    assert readings[8] == (
        "AttemptSucceeded",
        Verdict.STALE,
        "completion from worker-3 rejected: token 2 is stale, current is 3",
    )
    assert readings[10][1:] == (
        Verdict.REJECTED,
        "completion from worker-7 rejected: job is already succeeded",
    )
    assert readings[5][2] == (
        "token 2's lease expired (no heartbeat from worker-3), noted by node-1; "
        "retry in 924 ms (attempt 2 of 3)"  # the default policy: 1 s, less its jitter
    )
    assert readings[3][2] == "node-1 leased attempt 1 as token 2; a worker must start within 5 s"
    assert readings[9][2] == "attempt 2 succeeded on worker-7 (token 3); 1 effect committed"
    assert not found.drifted
    assert isinstance(found.state, JobState) and found.state.status is Status.SUCCEEDED


def test_as_of_an_offset_folds_the_stored_events_up_to_it(index_dir: Path) -> None:
    index = zombie_story().index(index_dir)
    try:
        running = audit(index, "job", as_of=7)
        before = audit(index, "job", as_of=4)
        now = audit(index, "job")
        stored = index.job("job")
    finally:
        index.close()

    assert running is not None and before is not None and now is not None
    assert [row.entry.offset for row in running.rows] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert isinstance(running.state, JobState)
    assert (running.state.status, running.state.token, running.state.attempt) == (
        Status.RUNNING,
        3,
        2,
    )
    assert isinstance(before.state, JobState)
    assert (before.state.status, before.state.token, before.state.worker_id) == (
        Status.RUNNING,
        2,
        "worker-3",
    )
    assert now.state == stored  # the refold ends where the index is


def test_refusals_duplicates_and_conflicts_are_read_out(index_dir: Path) -> None:
    story = Story()
    first = enq("k", idempotency_key="order-1")
    story.add(first)
    story.add(enq("k", idempotency_key="order-1"))  # same body: duplicate
    story.add(enq("k", idempotency_key="order-1", args=b"[1]"))  # other body: conflict
    story.add(lease("k", 1, 1))
    story.add(lease("k", 1, 1))  # the node proposes again: rejected
    story.add(expire("k", 1))  # before the lease ran out
    story.add(start("k", 1))
    story.add(start("k", 1, worker="worker-9"))
    story.add(fail("k", 1, retryable=False))
    story.add(cancel("k"))
    story.add(b"\x00garbage")
    index = story.index(index_dir)
    found = audit(index, "k")
    index.close()

    assert found is not None
    readings = [row.reading for row in found.rows]
    assert (
        readings[1]
        == "enqueue from client repeated with the same body (idempotency key 'order-1'): ignored"
    )
    assert readings[2] == (
        "enqueue from client refused: idempotency key 'order-1' on queue default was first used "
        "with a different body; the first enqueue stands"
    )
    assert readings[4] == "lease from node-1 rejected: job is leased (a late or duplicate proposal)"
    assert readings[5] == "lease expiry from node-1 rejected: token 1's lease runs 4.98 s longer"
    assert readings[7] == "start from worker-9 rejected: token 1 already started on worker-3"
    assert readings[8] == (
        "attempt 1 failed on worker-3 with permanent ConnectionError: reset by peer; "
        "dead: the error is permanent"
    )
    assert readings[9] == "cancel from client rejected: job is already dead"
    assert len(readings) == 10  # the undecodable record is no event of the job


def test_a_lease_off_the_next_token_reads_out_the_next_one(index_dir: Path) -> None:
    story = Story()
    story.add(enq("f"))
    story.add(lease("f", 2**53 - 1, 1))  # forged: the largest token there is
    story.add(lease("f", 6, 1))  # forged: ahead of the next
    story.add(lease("f", 1, 1))
    story.add(expire("f", 1), after_ms=5_000)  # unstarted: scheduled again, at token 1
    story.add(lease("f", 1, 1))  # a replay of the old lease
    index = story.index(index_dir)
    found = audit(index, "f")
    index.close()

    assert found is not None
    readings = [row.reading for row in found.rows]
    assert (
        readings[1]
        == "lease from node-1 rejected: it proposes token 9007199254740991, the next is 1"
    )
    assert readings[2] == "lease from node-1 rejected: it proposes token 6, the next is 1"
    assert readings[3] == "node-1 leased attempt 1 as token 1; a worker must start within 5 s"
    assert readings[5] == "lease from node-1 rejected: it proposes token 1, the next is 2"


def test_a_schedule_id_audits_like_a_job(index_dir: Path) -> None:
    template = ev.JobTemplate(task="report", queue="default", args=b"[]")
    story = Story()
    story.add(
        ev.ScheduleUpserted(
            event_id="u1",
            schedule_id="nightly",
            emitted_at=0,
            source="client",
            cron="0 3 * * *",
            timezone="UTC",
            template=template,
        )
    )
    story.add(ev.ScheduleDeleted(event_id="d1", schedule_id="nightly", emitted_at=0, source="api"))
    index = story.index(index_dir)
    found = audit(index, "nightly")
    assert audit(index, "nobody") is None
    index.close()

    assert found is not None and isinstance(found.state, ScheduleState)
    assert found.rows[0].reading == (
        "schedule created by client: '0 3 * * *' (UTC) enqueues report on default; "
        "next slot 2026-01-01T03:00:00.000Z"
    )
    assert found.rows[1].reading == "schedule deleted by api"
    assert found.state.deleted


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0 ms"),
        (999, "999 ms"),
        (1_000, "1 s"),
        (2_500, "2.5 s"),
        (90_000, "90 s"),
        (3_600_000, "60 min"),
        (7_200_000, "2 h"),
        (3 * 86_400_000, "3 d"),
    ],
)
def test_spans_read_in_the_largest_sensible_unit(ms: int, text: str) -> None:
    assert span(ms) == text


def test_times_are_utc_iso_with_milliseconds() -> None:
    assert iso(T0 + 12_345) == "2026-01-01T00:00:12.345Z"
    assert iso(None) == ""
