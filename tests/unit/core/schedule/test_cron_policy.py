"""Cron policies in the core: catch-up windows, missed slots, deterministic jitter and backfills,
as the planner proposes them and the schedule fold judges them."""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from evsched.core import bounds, ids
from evsched.core.events import (
    AttemptStarted,
    AttemptSucceeded,
    JobEvent,
    JobLeased,
    JobTemplate,
    Position,
    ScheduleFired,
    ScheduleUpserted,
)
from evsched.core.fold import fold
from evsched.core.planner import fire, plan_fires
from evsched.core.schedule import policy as cron_policy
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import JobState, ScheduleState, Status, TimelineEntry, Verdict

MINUTE = 60_000
T0 = int(datetime(2025, 1, 1, tzinfo=UTC).timestamp() * 1000)  # a slot of every minute
TEMPLATE = JobTemplate(task="report", queue="cron", args=b"{}")
_offsets = itertools.count()


def created(**policy: int | None) -> ScheduleState:
    event = ScheduleUpserted(
        event_id="up", schedule_id="s", emitted_at=0, source="api", cron="* * * * *",
        timezone="UTC", template=TEMPLATE, **policy,  # type: ignore[arg-type]
    )  # fmt: skip
    state, entry = fold_schedule(None, event, Position(partition=0, offset=0, log_at=T0 - 1))
    assert state is not None and entry.verdict is Verdict.APPLIED
    assert state.next_fire_at == T0
    return state


def judged(
    state: ScheduleState, event: ScheduleFired, at: int
) -> tuple[ScheduleState, TimelineEntry]:
    after, entry = fold_schedule(
        state, event, Position(partition=0, offset=next(_offsets), log_at=at)
    )
    assert after is not None
    return after, entry


def test_without_a_window_missed_slots_collapse_into_the_newest_as_before() -> None:
    state = created()

    assert cron_policy.due(state, T0 + 10 * MINUTE + 5) == (T0 + 10 * MINUTE, None)
    assert cron_policy.due(state, T0 - 1) is None
    assert cron_policy.due(replace(state, deleted=True), T0) is None


def test_within_the_window_every_missed_slot_fires_in_order_as_caught_up() -> None:
    state = created(catchup_window_ms=5 * MINUTE)
    now = T0 + 3 * MINUTE + 5
    fired: list[tuple[int, str | None]] = []
    while (due := cron_policy.due(state, now)) is not None:
        fired.append(due)
        [(event, job)] = plan_fires([state], now=now, source="node-1")
        assert job is not None and job.run_at == due[0]
        state, entry = judged(state, event, now + 3)
        assert entry.verdict is Verdict.APPLIED
    assert fired == [
        (T0, cron_policy.CAUGHT_UP),
        (T0 + MINUTE, cron_policy.CAUGHT_UP),
        (T0 + 2 * MINUTE, cron_policy.CAUGHT_UP),
        (T0 + 3 * MINUTE, None),
    ]
    assert (
        entry.reason
        == f"fired slot {T0 + 3 * MINUTE} as job {ids.job_id_for_fire('s', T0 + 3 * MINUTE)}"
    )


def test_slots_before_the_window_are_skipped_by_one_missed_fire_without_a_job() -> None:
    state = created(catchup_window_ms=2 * MINUTE)
    now = T0 + 10 * MINUTE + 5

    assert cron_policy.due(state, now) == (T0 + 8 * MINUTE, cron_policy.MISSED)
    [(event, job)] = plan_fires([state], now=now, source="node-1")
    state, entry = judged(state, event, now + 3)

    assert job is None and entry.verdict is Verdict.APPLIED
    assert entry.reason == (
        f"skipped slots from {T0} to {T0 + 8 * MINUTE}: outside the 120000 ms catch-up window"
    )
    assert (state.next_fire_at, state.last_fire_at) == (T0 + 9 * MINUTE, None)
    assert cron_policy.due(state, now) == (T0 + 9 * MINUTE, cron_policy.CAUGHT_UP)
    [(caught, _)] = plan_fires([state], now=now, source="node-1")
    _, entry = judged(state, caught, now + 3)
    assert entry.reason.startswith(f"caught up slot {T0 + 9 * MINUTE} as job ")
    assert entry.reason.endswith(f" ({MINUTE + 8} ms late)")


def test_a_missed_fire_is_rejected_without_a_window_or_inside_it() -> None:
    missed = fire(created(), T0, now=T0, source="n", decision=cron_policy.MISSED)[0]

    _, none = judged(created(), missed, T0 + 10 * MINUTE)
    _, inside = judged(created(catchup_window_ms=5 * MINUTE), missed, T0 + 2 * MINUTE)

    assert none.reason == "no catch-up window: a missed slot is fired, not skipped"
    assert inside.reason == f"slot {T0} is within the 300000 ms catch-up window"
    assert none.verdict is inside.verdict is Verdict.REJECTED


def test_jitter_is_derived_from_the_schedule_and_slot_and_checked_by_the_fold() -> None:
    state = created(max_jitter_ms=30_000)
    offsets = [cron_policy.jitter_ms("s", T0 + n * MINUTE, 30_000) for n in range(20)]
    assert all(0 <= o <= 30_000 for o in offsets) and len(set(offsets)) > 10
    assert offsets[0] == cron_policy.jitter_ms("s", T0, 30_000)  # the same on every replica
    assert cron_policy.jitter_ms("s", T0, None) == cron_policy.jitter_ms("s", T0, 0) == 0

    [(event, job)] = plan_fires([state], now=T0, source="node-1")
    assert job is not None and event.run_at == job.run_at == T0 + offsets[0]
    after, entry = judged(state, event, T0 + 2)
    assert entry.reason.endswith(f", jittered to {T0 + offsets[0]} (+{offsets[0]} ms)")
    assert after.last_fire_at == T0

    _, forged = judged(state, replace(event, run_at=T0 + offsets[0] + 1), T0 + 2)
    assert forged.verdict is Verdict.REJECTED
    assert forged.reason.startswith(f"run_at {T0 + offsets[0] + 1} is not slot {T0}'s jittered")


def test_a_backfill_fires_past_slots_without_moving_the_schedule() -> None:
    state = created()
    state, _ = judged(
        state, plan_fires([state], now=T0 + 5 * MINUTE, source="n")[0][0], T0 + 5 * MINUTE
    )
    slots = cron_policy.backfill_slots(state, T0 - 3 * MINUTE, T0 - MINUTE + 1)
    assert slots == [T0 - 3 * MINUTE, T0 - 2 * MINUTE, T0 - MINUTE]

    event, job = fire(state, slots[0], now=T0 + 6 * MINUTE, source="cli", decision="backfilled")
    after, entry = judged(state, event, T0 + 6 * MINUTE)

    assert entry.verdict is Verdict.APPLIED
    assert entry.reason == f"backfilled slot {slots[0]} as job {ids.job_id_for_fire('s', slots[0])}"
    assert (after.next_fire_at, after.last_fire_at) == (state.next_fire_at, state.last_fire_at)
    assert job is not None and job.job_id == event.job_id and job.fire_at == slots[0]
    assert event.event_id == ids.decision_event_id("s", "backfill", slots[0])


@pytest.mark.parametrize(
    ("slot", "at", "reason"),
    [
        (T0 + 9 * MINUTE, T0 + 6 * MINUTE, "is in the future: only past slots are backfilled"),
        (T0 + 6 * MINUTE, T0 + 7 * MINUTE, f"is not before the next due slot {T0 + 6 * MINUTE}"),
        (T0 - MINUTE + 1, T0 + 7 * MINUTE, "is not a slot of '* * * * *'"),
    ],
)
def test_a_backfill_of_a_future_coming_or_non_slot_is_rejected(
    slot: int, at: int, reason: str
) -> None:
    state = replace(created(), next_fire_at=T0 + 6 * MINUTE)
    event, _ = fire(state, slot, now=at, source="cli", decision=cron_policy.BACKFILLED)

    _, entry = judged(state, event, at)

    assert entry.verdict is Verdict.REJECTED and reason in entry.reason


def test_a_backfill_is_bounded() -> None:
    slots = cron_policy.backfill_slots(created(), T0, T0 + 10 * 24 * 60 * MINUTE)
    assert len(slots) == cron_policy.MAX_BACKFILL_SLOTS + 1


def test_the_limits_of_the_new_fields() -> None:
    event, _ = fire(created(), T0, now=T0, source="n")
    assert bounds.refusal(replace(event, decision="later")) == (
        "decision 'later' is not one of caught_up, missed, backfilled"
    )
    assert bounds.refusal(replace(event, run_at=-1)) is not None
    upsert = ScheduleUpserted(
        event_id="up", schedule_id="s", emitted_at=0, source="api", cron="* * * * *",
        timezone="UTC", template=TEMPLATE, catchup_window_ms=-1,
    )  # fmt: skip
    assert bounds.refusal(upsert) == "catchup_window_ms -1 is outside [0, 315619200000]"
    assert bounds.refusal(replace(upsert, catchup_window_ms=None, max_jitter_ms=-5)) is not None
    assert bounds.refusal(replace(upsert, catchup_window_ms=None, overlap="sometimes")) == (
        "overlap 'sometimes' is not one of allow, skip, buffer"
    )
    assert bounds.refusal(replace(upsert, catchup_window_ms=None, overlap="skip")) is None


def _fire_and_enqueue(
    state: ScheduleState, job: JobState | None, slot: int
) -> tuple[ScheduleState, JobState | None, TimelineEntry]:
    """Fire ``slot`` as a node would, and fold its enqueue into the job."""
    [(event, enqueued)] = plan_fires([state], now=slot, source="node-1")
    assert event.fire_at == slot and enqueued is not None
    state, _ = judged(state, event, slot + 1)
    job, entry = fold(job, enqueued, Position(partition=1, offset=next(_offsets), log_at=slot + 2))
    return state, job, entry


def _run(job: JobState | None, at: int, *events: JobEvent) -> JobState | None:
    for event in events:
        job, _ = fold(job, event, Position(partition=1, offset=next(_offsets), log_at=at))
    return job


def _lease_and_start(job_id: str, token: int) -> tuple[JobEvent, JobEvent]:
    meta = {"job_id": job_id, "emitted_at": 0, "source": "x", "token": token}
    return (
        JobLeased(event_id=f"l{token}", attempt=1, lease_ms=MINUTE, **meta),  # type: ignore[arg-type]
        AttemptStarted(event_id=f"s{token}", worker_id="w", lease_ms=9 * MINUTE, **meta),  # type: ignore[arg-type]
    )


def _succeed(job_id: str, token: int) -> JobEvent:
    return AttemptSucceeded(
        event_id=f"o{token}", job_id=job_id, emitted_at=0, source="x", token=token, result=b"1"
    )


@pytest.mark.parametrize(
    ("overlap", "verdicts"),
    [
        # skip: the fires while run 0 is active are duplicates; after it ends, a new run
        (
            cron_policy.SKIP,
            [Verdict.APPLIED, Verdict.DUPLICATE, Verdict.DUPLICATE, Verdict.APPLIED],
        ),
        # buffer: one fire waits while run 0 runs, a further one is a duplicate
        (
            cron_policy.BUFFER,
            [Verdict.APPLIED, Verdict.APPLIED, Verdict.DUPLICATE, Verdict.DUPLICATE],
        ),
    ],
)
def test_an_overlap_policy_makes_every_fire_a_run_of_one_unique_job(
    overlap: str, verdicts: list[Verdict]
) -> None:
    state = created(overlap=overlap)  # type: ignore[arg-type]
    job_id = ids.job_id_for_runs("s")
    state, job, first = _fire_and_enqueue(state, None, T0)
    job = _run(job, T0 + 3, *_lease_and_start(job_id, 1))
    state, job, second = _fire_and_enqueue(state, job, T0 + MINUTE)  # while running
    state, job, third = _fire_and_enqueue(state, job, T0 + 2 * MINUTE)
    job = _run(job, T0 + 2 * MINUTE + 5, _succeed(job_id, 1))
    state, job, fourth = _fire_and_enqueue(state, job, T0 + 3 * MINUTE)

    assert [e.verdict for e in (first, second, third, fourth)] == verdicts
    assert job is not None and job.job_id == job_id and job.generation == 1
    assert state.last_job_id == job_id
    if overlap == cron_policy.BUFFER:  # the held fire became run 1 when run 0 ended
        assert (job.status, job.run_at) == (Status.SCHEDULED, T0 + 2 * MINUTE + 5)
        assert fourth.reason == "unique while queued: run 1 is scheduled"
    else:
        assert third.reason == "unique while queued or running: run 0 is running"


def test_without_an_overlap_policy_every_slot_has_its_own_job() -> None:
    assert cron_policy.fired_job("s", T0, None) == (ids.job_id_for_fire("s", T0), None)
    assert cron_policy.fired_job("s", T0, "allow") == (ids.job_id_for_fire("s", T0), None)
    assert cron_policy.fired_job("s", T0, "skip") == (ids.job_id_for_runs("s"), "active")


def test_a_changed_template_starts_the_next_run_with_its_body() -> None:
    state = created(overlap=cron_policy.SKIP)  # type: ignore[arg-type]
    state, job, _ = _fire_and_enqueue(state, None, T0)
    job_id = ids.job_id_for_runs("s")
    job = _run(job, T0 + 3, *_lease_and_start(job_id, 1), _succeed(job_id, 1))
    other = replace(state, template=replace(TEMPLATE, args=b'{"v": 2}'))
    _, job, entry = _fire_and_enqueue(other, job, T0 + MINUTE)

    assert entry.verdict is Verdict.APPLIED and job is not None and job.args == b'{"v": 2}'
