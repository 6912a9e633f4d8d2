"""The dashboard's live counters and timeline picture, fed folded events directly."""

from __future__ import annotations

import asyncio

import pytest

from evsched.api.dashboard.history import picture
from evsched.api.dashboard.live import Live
from evsched.core.events import RetryPolicy
from evsched.core.state import FoldedEvent, JobError, JobState, Status, TimelineEntry, Verdict

RUN_AT = 1_000_000


def state(status: Status, token: int = 1, **more: object) -> JobState:
    return JobState(
        job_id="j1",
        status=status,
        task="t",
        queue="q",
        args=b"",
        priority=0,
        run_at=RUN_AT,
        max_attempts=3,
        retry=RetryPolicy(),
        timeout_ms=1_000,
        enqueued_at=0,
        updated_at=0,
        partition=0,
        token=token,
        **more,  # type: ignore[arg-type]
    )


def entry(
    kind: str,
    at: int,
    *,
    verdict: Verdict = Verdict.APPLIED,
    token: int | None = 1,
    source: str = "worker-w1",
    offset: int = 0,
) -> TimelineEntry:
    return TimelineEntry(
        partition=0,
        offset=offset,
        log_at=at,
        kind=kind,
        event_id=f"{kind}{at}",
        source=source,
        verdict=verdict,
        reason="r",
        token=token,
    )


def folded(kind: str, at: int, before: Status, after: Status, **kw: object) -> FoldedEvent:
    return FoldedEvent(entry=entry(kind, at, **kw), before=state(before), after=state(after))  # type: ignore[arg-type]


def test_counters_series_and_percentiles_follow_the_commits() -> None:
    depth = {"q": 3}
    live = Live(lambda: depth)
    live.observe_commit(
        [
            folded("JobLeased", RUN_AT, Status.SCHEDULED, Status.LEASED, source="node-n1", token=1),
            folded("AttemptStarted", RUN_AT + 250, Status.LEASED, Status.RUNNING),
        ]
    )
    live.observe_commit(
        [
            folded("AttemptFailed", RUN_AT + 1_250, Status.RUNNING, Status.SCHEDULED),
            folded(
                "AttemptSucceeded",
                RUN_AT + 3_000,
                Status.RUNNING,
                Status.SUCCEEDED,
                verdict=Verdict.STALE,
            ),
        ]
    )
    assert live.version == 2
    assert [(s.at_s, s.started, s.finished) for s in live.series] == [(1000, 1, 0), (1001, 0, 1)]
    assert live.series[0].depth == {"q": 3}
    p = live.percentiles()
    # HdrHistogram with 2 significant digits: within 1 %
    assert p["lateness_s"]["p50"] == pytest.approx(0.25, rel=0.01)
    assert p["processing_s"]["p99"] == pytest.approx(1.0, rel=0.01)
    assert live.deciders == {0: ("node-n1", RUN_AT)}
    assert [w for w, _ in live.workers_seen()] == ["worker-w1"]


def test_dead_letters_are_kept_once_seeded() -> None:
    live = Live(dict)
    dead = state(
        Status.DEAD, last_error=JobError(error_type="KeyError", message="m", retryable=False)
    )
    live.dead.seed(lambda: [dead])
    assert live.dead.groups() == [("t", "permanent / KeyError", 1)]
    live.observe_commit(
        [
            FoldedEvent(
                entry=entry("JobRequeued", 5, token=None),
                before=dead,
                after=state(Status.SCHEDULED),
            )
        ]
    )
    assert live.dead.groups() == []


async def test_streams_wake_on_a_commit_and_end_on_close() -> None:
    live = Live(dict)
    waiting = asyncio.ensure_future(live.changed(0, timeout_s=30))
    await asyncio.sleep(0)
    live.observe_commit([])
    assert await asyncio.wait_for(waiting, 5) == 1
    live.close()
    assert await live.changed(1, timeout_s=30) is None
    await asyncio.wait_for(live.pause(30), 5)


def test_the_picture_has_a_bar_per_token_and_marks_refused_writes() -> None:
    entries = [
        entry("JobEnqueued", 0, token=None, offset=0),
        entry("JobLeased", 1_000, offset=1),
        entry("AttemptStarted", 1_500, offset=2),
        entry("LeaseExpired", 4_000, offset=3),
        entry("JobLeased", 5_000, token=2, offset=4),
        entry("AttemptSucceeded", 6_000, verdict=Verdict.STALE, offset=5),
        entry("JobCancelled", 7_000, token=None, offset=6),
    ]
    chart = picture(entries, now_ms=8_000).chart()
    assert chart["rows"] == ["job", "token 1", "token 2"]
    assert chart["leased"] == [{"y": "token 1", "x": [1.0, 1.5]}, {"y": "token 2", "x": [5.0, 7.0]}]
    assert chart["running"] == [{"y": "token 1", "x": [1.5, 4.0], "o": "LeaseExpired"}]
    stale = [p for p in chart["points"] if p["verdict"] == "stale"]
    assert [(p["y"], p["x"]) for p in stale] == [("token 1", 6.0)]


def test_a_refused_decision_does_not_name_the_last_decider() -> None:
    live = Live(lambda: {})
    live.observe_commit(
        [folded("JobLeased", RUN_AT, Status.SCHEDULED, Status.LEASED, source="node-n1", token=1)]
    )
    forged = folded(
        "JobLeased",
        RUN_AT + 5,
        Status.LEASED,
        Status.LEASED,
        source="node-forger",
        token=2,
        verdict=Verdict.REJECTED,
    )
    live.observe_commit([forged])
    assert live.deciders == {0: ("node-n1", RUN_AT)}
