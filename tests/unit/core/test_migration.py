"""Namespace migration's plan (core.migration): what is carried, and how the fold judges the pair
of events of each move in both namespaces, including a repeated migration."""

from __future__ import annotations

from dataclasses import replace

from evsched.core import migration
from evsched.core.events import JobTemplate, Position
from evsched.core.fold import fold
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import ScheduleState, Status, Verdict
from tests.states import job_state

AT = Position(partition=0, offset=10, log_at=5_000)
NOW = 4_000


def schedule(**changes: object) -> ScheduleState:
    base = ScheduleState(
        schedule_id="s",
        cron="*/5 * * * *",
        timezone="UTC",
        template=JobTemplate(task="t", queue="q", args=b"[]", priority=3),
        created_at=7,
        updated_at=7,
        next_fire_at=300_000,
        catchup_window_ms=60_000,
        overlap="skip",
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_only_scheduled_jobs_of_paused_queues_move_and_other_live_jobs_are_left() -> None:
    jobs = [
        job_state("due", queue="q", partition=0),
        job_state("other-queue", queue="r", partition=0),
        job_state("other-partition", queue="q", partition=1),
        job_state("running", status=Status.RUNNING),
        job_state("leased", status=Status.LEASED),
        job_state("waiting", status=Status.WAITING),
        job_state("parent", children=("waiting",)),
        job_state("done", status=Status.SUCCEEDED),
        job_state("dead", status=Status.DEAD),
        job_state("cancelled", status=Status.CANCELLED),
    ]
    plan = migration.plan(
        jobs,
        [schedule(), schedule(schedule_id="gone", deleted=True)],
        paused={(0, "q")},
        to_namespace="big",
        now_ms=NOW,
    )
    assert [m.enqueued.job_id for m in plan.jobs] == ["due"]
    assert [s.job_id for s in plan.left] == [
        "other-queue",
        "other-partition",
        "running",
        "leased",
        "waiting",
        "parent",
    ]
    assert [m.upserted.schedule_id for m in plan.schedules] == ["s"]


def test_a_moved_job_keeps_its_id_and_body_and_its_attempts_left() -> None:
    state = job_state(
        "j",
        run_at=9_000,
        attempt=2,
        max_attempts=5,
        priority=4,
        idempotency_key="k",
        labels={"team": "a"},
        unique="queued",
    )
    move = migration.job_move(state, to_namespace="big", now_ms=NOW)
    new = move.enqueued
    assert (new.job_id, new.task, new.queue, new.args) == ("j", state.task, state.queue, b"{}")
    assert (new.run_at, new.max_attempts, new.priority) == (9_000, 3, 4)
    assert (new.idempotency_key, new.labels, new.unique) == ("k", {"team": "a"}, "queued")
    assert move.cancelled.reason == "moved to namespace big" == migration.moved_reason("big")
    assert new.source == move.cancelled.source == "migrate"
    spent = migration.job_move(replace(state, attempt=7), to_namespace="big", now_ms=NOW)
    assert spent.enqueued.max_attempts == 1


def test_the_fold_enqueues_in_the_new_namespace_and_cancels_in_the_old_once() -> None:
    old = job_state("j", run_at=9_000, attempt=1, max_attempts=3)
    move = migration.job_move(old, to_namespace="big", now_ms=NOW)
    carried, entry = fold(None, move.enqueued, AT)
    assert entry.verdict is Verdict.APPLIED
    assert carried is not None
    assert (carried.status, carried.run_at, carried.max_attempts) == (Status.SCHEDULED, 9_000, 2)
    ended, entry = fold(old, move.cancelled, AT)
    assert entry.verdict is Verdict.APPLIED
    assert ended is not None and ended.status is Status.CANCELLED
    # A repeated (or resumed) run writes the same events: duplicates in both namespaces.
    again = migration.job_move(old, to_namespace="big", now_ms=NOW + 1)
    assert again.enqueued.event_id == move.enqueued.event_id
    assert fold(carried, again.enqueued, AT)[1].verdict is Verdict.DUPLICATE
    assert fold(ended, again.cancelled, AT)[1].verdict is Verdict.DUPLICATE


def test_a_moved_schedule_keeps_its_cron_template_and_policies() -> None:
    move = migration.schedule_move(schedule(), now_ms=NOW)
    up = move.upserted
    assert (up.schedule_id, up.cron, up.timezone) == ("s", "*/5 * * * *", "UTC")
    assert (up.template.priority, up.catchup_window_ms, up.overlap) == (3, 60_000, "skip")
    created, entry = fold_schedule(None, up, AT)
    assert entry.verdict is Verdict.APPLIED and created is not None
    deleted, entry = fold_schedule(schedule(), move.deleted, AT)
    assert entry.verdict is Verdict.APPLIED
    assert deleted is not None and deleted.deleted
    assert fold_schedule(created, up, AT)[1].verdict is Verdict.DUPLICATE
