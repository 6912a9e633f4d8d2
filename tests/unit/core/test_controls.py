"""Pause and resume as the fold judges them: the switches, and their guards on leases and fires."""

from __future__ import annotations

from dataclasses import replace

from evsched.core.controls import (
    QUEUE,
    SCHEDULE,
    fold_control,
    fold_job,
    fold_schedule_guarded,
    target_of,
)
from evsched.core.events import (
    JobEnqueued,
    JobLeased,
    JobTemplate,
    Position,
    QueuePaused,
    QueueResumed,
    ScheduleFired,
    SchedulePaused,
    ScheduleResumed,
    ScheduleUpserted,
    entity_id,
)
from evsched.core.fold import fold
from evsched.core.invariants import replay
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import Status, Verdict

AT = Position(partition=0, offset=5, log_at=1_700_000_000_000)


def paused(queue: str = "q", event_id: str = "p1", reason: str = "") -> QueuePaused:
    return QueuePaused(event_id=event_id, queue=queue, emitted_at=0, source="cli", reason=reason)


def resumed(queue: str = "q", event_id: str = "r1") -> QueueResumed:
    return QueueResumed(event_id=event_id, queue=queue, emitted_at=0, source="cli")


def test_a_queue_pause_applies_once_and_a_resume_undoes_it() -> None:
    state, entry = fold_control(None, paused(reason="deploy"), AT)
    assert entry.verdict is Verdict.APPLIED and state is not None and state.paused
    assert (state.target, state.name, state.reason) == (QUEUE, "q", "deploy")
    assert entry.reason == "queue q paused by cli: deploy"
    again, second = fold_control(state, paused(event_id="p2"), AT)
    assert second.verdict is Verdict.REJECTED and again is state
    assert second.reason == "queue q is already paused"
    back, third = fold_control(state, resumed(), AT)
    assert third.verdict is Verdict.APPLIED and back is not None and not back.paused
    same, fourth = fold_control(back, resumed(event_id="r2"), AT)
    assert fourth.verdict is Verdict.REJECTED and fourth.reason == "queue q is not paused"
    assert same is back


def test_a_repeated_event_id_is_a_duplicate_and_a_resume_of_nothing_is_rejected() -> None:
    state, _ = fold_control(None, paused(), AT)
    assert fold_control(state, paused(), AT)[1].verdict is Verdict.DUPLICATE
    assert fold_control(None, resumed(), AT)[1].verdict is Verdict.REJECTED


def test_hostile_controls_are_rejected_with_the_limit_they_break() -> None:
    _, entry = fold_control(None, paused(queue="bad queue!"), AT)
    assert entry.verdict is Verdict.REJECTED and "queue" in entry.reason
    pause = SchedulePaused(event_id="x", schedule_id="s" * 2000, emitted_at=0, source="?")
    _, entry = fold_control(None, pause, AT, exists=True)
    assert entry.verdict is Verdict.REJECTED and "schedule_id" in entry.reason


def test_a_schedule_switch_needs_a_live_schedule() -> None:
    pause = SchedulePaused(event_id="x", schedule_id="s", emitted_at=0, source="api")
    _, entry = fold_control(None, pause, AT, exists=False)
    assert entry.verdict is Verdict.REJECTED and entry.reason == "unknown or deleted schedule s"
    state, entry = fold_control(None, pause, AT)
    assert entry.verdict is Verdict.APPLIED and state is not None and state.target == SCHEDULE
    resume = ScheduleResumed(event_id="y", schedule_id="s", emitted_at=0, source="api")
    assert target_of(resume) == (SCHEDULE, "s") and entity_id(resume) == "s"
    assert entity_id(paused()) == "q"
    state, entry = fold_control(state, resume, AT)
    assert entry.verdict is Verdict.APPLIED and state is not None and not state.paused


def _job(queue: str) -> JobEnqueued:
    return JobEnqueued(
        event_id="e", job_id="j", emitted_at=0, source="c", task="t", queue=queue, args=b"[]"
    )


def test_a_lease_on_a_paused_queue_is_rejected_and_changes_nothing() -> None:
    job, _ = fold(None, _job("q"), AT)
    lease = JobLeased(event_id="l", job_id="j", emitted_at=0, source="node-z", token=1,
                      attempt=1, lease_ms=1000)  # fmt: skip
    later = replace(AT, offset=6)
    after, entry = fold_job(job, lease, later, {"q"})
    assert after is job and entry.verdict is Verdict.REJECTED
    assert entry.reason == "cannot lease: queue q is paused"
    assert entry.status_after is Status.SCHEDULED
    after, entry = fold_job(job, lease, later, {"other"})
    assert entry.verdict is Verdict.APPLIED and after is not None and after.token == 1
    # A lease the fold refuses anyway keeps its own reason.
    _, entry = fold_job(job, replace(lease, token=0), later, {"q"})
    assert entry.verdict is Verdict.REJECTED and "token" in entry.reason


def _schedule() -> ScheduleUpserted:
    template = JobTemplate(task="t", queue="q", args=b"[]")
    return ScheduleUpserted(event_id="u", schedule_id="s", emitted_at=0, source="c",
                            cron="* * * * *", timezone="UTC", template=template)  # fmt: skip


def test_a_fire_of_a_paused_schedule_is_rejected() -> None:
    schedule, _ = fold_schedule(None, _schedule(), AT)
    assert schedule is not None and schedule.next_fire_at is not None
    slot = schedule.next_fire_at
    fire = ScheduleFired(event_id="f", schedule_id="s", emitted_at=0, source="node-z",
                         fire_at=slot, job_id="cron-job")  # fmt: skip
    due = Position(partition=0, offset=9, log_at=slot)
    after, entry = fold_schedule_guarded(schedule, fire, due, paused=True)
    assert after is schedule and entry.verdict is Verdict.REJECTED
    assert entry.reason == f"cannot fire slot {slot}: schedule s is paused"
    after, entry = fold_schedule_guarded(schedule, fire, due, paused=False)
    assert entry.verdict is Verdict.APPLIED and after is not None and after.last_fire_at == slot


def test_replay_keeps_a_queue_switch_per_partition() -> None:
    lease = JobLeased(event_id="l", job_id="j", emitted_at=0, source="node", token=1,
                      attempt=1, lease_ms=1000)  # fmt: skip
    history = [
        (_job("q"), Position(partition=1, offset=0, log_at=10)),
        (paused(), Position(partition=0, offset=0, log_at=11)),  # another partition's copy
        (lease, Position(partition=1, offset=1, log_at=12)),
    ]
    done = replay(history)
    assert [e.verdict for e in done.job_timelines["j"]] == [Verdict.APPLIED, Verdict.APPLIED]
    history.insert(1, (paused(), Position(partition=1, offset=1, log_at=11)))
    history[-1] = (lease, Position(partition=1, offset=2, log_at=12))
    done = replay(history)
    assert done.job_timelines["j"][-1].verdict is Verdict.REJECTED
    assert done.paused(1, QUEUE) == {"q"} and done.paused(0, QUEUE) == {"q"}
    pause = SchedulePaused(event_id="x", schedule_id="s", emitted_at=0, source="api")
    done = replay([(pause, Position(partition=0, offset=0, log_at=1))])
    assert done.paused(0, SCHEDULE) == set()  # unknown schedule: rejected
    done = replay([(_schedule(), AT), (pause, replace(AT, offset=6))])
    assert done.paused(0, SCHEDULE) == {"s"}
