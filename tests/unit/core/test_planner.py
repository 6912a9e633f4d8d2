"""The scheduler's pure decisions: lease order and budgets, expiries, cron fires."""

from __future__ import annotations

from dataclasses import replace

from evsched.core import ids, planner
from evsched.core.dispatch import external_idempotency_key
from evsched.core.events import JobTemplate
from evsched.core.schedule import cron
from evsched.core.state import JobState, ScheduleState, Status
from tests.states import job_state

BUDGETS = planner.PlannerBudgets(
    dispatch_timeout_ms=5_000, max_in_flight_per_queue=2, prelease_ms=0
)


def job(job_id: str, **changes: object) -> JobState:
    base = {"run_at": 1_000, "timeout_ms": 10_000, "enqueued_at": 500, "updated_at": 500}
    return job_state(job_id, **(base | {"partition": 2} | changes))


def test_leases_go_by_priority_then_run_at_and_respect_the_in_flight_limit() -> None:
    jobs = [
        job("a", run_at=900),
        job("b", run_at=800),
        job("c", run_at=950, priority=5),
        job("later", run_at=2_000, priority=9),
        job("running", status=Status.RUNNING, priority=9),
    ]
    leases = planner.plan_leases(jobs, {"q": 0}, now=1_000, budgets=BUDGETS, source="node-1")
    assert [lease.event.job_id for lease in leases] == ["c", "b"]
    first = leases[0]
    assert first.event.token == 1 and first.event.attempt == 1
    assert first.event.lease_ms == 5_000
    assert first.dispatch.token == first.event.token and first.dispatch.partition == 2
    assert first.event.event_id == ids.decision_event_id("c", "lease", 1)


def test_jobs_due_within_the_horizon_are_pre_leased_for_their_run_at() -> None:
    budgets = replace(BUDGETS, prelease_ms=1_000, max_in_flight_per_queue=10)
    jobs = [job("due", run_at=900), job("soon", run_at=1_800), job("later", run_at=2_001)]
    leases = planner.plan_leases(jobs, {}, now=1_000, budgets=budgets, source="n")
    by_id = {lease.event.job_id: lease for lease in leases}
    assert sorted(by_id) == ["due", "soon"]
    assert by_id["soon"].event.not_before == 1_800 and by_id["soon"].dispatch.run_at == 1_800
    # A job that came due within the horizon names its run_at too: a node clock ahead of the
    # log's would otherwise see its lease refused as early.
    assert by_id["due"].event.not_before == 900
    stale = planner.plan_leases([job("old", run_at=-1)], {}, now=1_000, budgets=budgets, source="n")
    assert stale[0].event.not_before is None


def test_a_full_queue_leases_nothing_but_other_queues_still_run() -> None:
    jobs = [job("a"), job("b", queue="other")]
    leases = planner.plan_leases(jobs, {"q": 2}, now=1_000, budgets=BUDGETS, source="n")
    assert [lease.event.job_id for lease in leases] == ["b"]


def test_a_queue_without_a_worker_gets_no_lease_until_one_is_seen() -> None:
    budgets = replace(BUDGETS, prelease_ms=1_000, max_in_flight_per_queue=10)
    jobs = [job("a", priority=9), job("soon", run_at=1_500), job("b", queue="other")]
    # Nobody serves q: its jobs, due or within the pre-lease horizon, stay scheduled.
    leases = planner.plan_leases(
        jobs, {}, staffed={"other"}, now=1_000, budgets=budgets, source="n"
    )
    assert [lease.event.job_id for lease in leases] == ["b"]
    # A worker of q is seen: the same candidates are leased, in the usual order.
    leases = planner.plan_leases(
        jobs, {}, staffed={"q", "other"}, now=1_000, budgets=budgets, source="n"
    )
    assert [lease.event.job_id for lease in leases] == ["a", "b", "soon"]
    # Not known (None, the default): every queue is leased, as before presence was asked.
    leases = planner.plan_leases(jobs, {}, staffed=None, now=1_000, budgets=budgets, source="n")
    assert len(leases) == 3
    none = planner.plan_leases(jobs, {}, staffed=set(), now=1_000, budgets=budgets, source="n")
    assert none == []


def test_next_lease_uses_the_next_token_and_attempt() -> None:
    state = job("a", token=4, attempt=1, checkpoint=b"7")
    (lease,) = planner.plan_leases([state], {}, now=1_000, budgets=BUDGETS, source="n")
    assert (lease.event.token, lease.event.attempt) == (5, 2)
    assert lease.dispatch.checkpoint == b"7"


def test_expiries_only_for_live_leases_whose_time_ran_out() -> None:
    states = [
        job("gone", status=Status.RUNNING, token=3, lease_until=900),
        job("live", status=Status.LEASED, token=1, lease_until=1_500),
        job("edge", status=Status.LEASED, token=2, lease_until=1_000),
        job("idle", status=Status.SCHEDULED, lease_until=None),
        job("nolease", status=Status.RUNNING, lease_until=None),
    ]
    expiries = planner.plan_expiries(states, now=1_000, source="n")
    assert [(e.job_id, e.token) for e in expiries] == [("gone", 3), ("edge", 2)]


def schedule(**changes: object) -> ScheduleState:
    base = ScheduleState(
        schedule_id="s",
        cron="*/5 * * * *",
        timezone="UTC",
        template=JobTemplate(task="t", queue="q", args=b"[]", priority=3),
        created_at=0,
        updated_at=0,
        next_fire_at=300_000,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_fires_coalesce_missed_slots_and_derive_ids_from_the_slot() -> None:
    now = 1_000_000  # slots at 300k, 600k, 900k are due: fire only 900k
    ((fired, enqueued),) = planner.plan_fires([schedule()], now=now, source="n")
    assert fired.fire_at == 900_000 == enqueued.fire_at == enqueued.run_at
    assert enqueued.job_id == fired.job_id == ids.job_id_for_fire("s", 900_000)
    assert enqueued.priority == 3 and enqueued.schedule_id == "s"
    assert enqueued.idempotency_key == ids.fire_idempotency_key("s", 900_000)
    assert cron.next_fire_at("*/5 * * * *", "UTC", fired.fire_at) == 1_200_000


def test_no_fire_before_the_slot_nor_for_deleted_schedules() -> None:
    assert planner.plan_fires([schedule()], now=299_999, source="n") == []
    deleted = schedule(deleted=True, next_fire_at=None)
    assert planner.plan_fires([deleted], now=10**9, source="n") == []


def test_external_idempotency_key_is_stable_per_job() -> None:
    assert external_idempotency_key("j1") == external_idempotency_key("j1")
    assert external_idempotency_key("j1") != external_idempotency_key("j2")


def test_leases_stop_at_the_unstarted_limit_while_running_jobs_do_not_count() -> None:
    budgets = planner.PlannerBudgets(max_in_flight_per_queue=100, max_unstarted_per_queue=3)
    jobs = [job(f"j{i}") for i in range(10)]
    # 50 running, 1 leased but not started: two more leases, then the queue waits for workers.
    leases = planner.plan_leases(
        jobs, {"q": 51}, unstarted={"q": 1}, now=1_000, budgets=budgets, source="n"
    )
    assert [lease.event.job_id for lease in leases] == ["j0", "j1"]
    none = planner.plan_leases(
        jobs, {"q": 3}, unstarted={"q": 3}, now=1_000, budgets=budgets, source="n"
    )
    assert none == []


def test_the_unstarted_limit_is_per_queue_and_has_a_documented_default() -> None:
    assert planner.PlannerBudgets().max_unstarted_per_queue == 100
    budgets = planner.PlannerBudgets(max_unstarted_per_queue=1)
    jobs = [job("a"), job("b"), job("c", queue="other"), job("d", queue="other")]
    leases = planner.plan_leases(jobs, {}, unstarted={}, now=1_000, budgets=budgets, source="n")
    assert [lease.event.job_id for lease in leases] == ["a", "c"]


def test_a_raised_unstarted_limit_holds_for_its_queue_only() -> None:
    budgets = planner.PlannerBudgets(max_unstarted_per_queue=1)
    jobs = [job(f"q{i}") for i in range(4)] + [job(f"o{i}", queue="other") for i in range(4)]
    leases = planner.plan_leases(
        jobs, {}, unstarted={}, unstarted_limits={"q": 3}, now=1_000, budgets=budgets, source="n"
    )
    assert [lease.event.job_id for lease in leases] == ["o0", "q0", "q1", "q2"]
