"""Uniqueness scopes and cron policies on the real broker with real processes, judged from the log.

The run is the ``policies`` replay scenario (``replay/scenario_policies.py``); here the log it
leaves is checked: the unique job's duplicates, held enqueue and its next run; the missed and
caught-up fires after the only node was stopped, their jitter; the CLI's backfills, repeated
without a second job, and a hostile backfill rejected.
"""

from __future__ import annotations

import pytest
import pytest_asyncio
from replay.scenario_policies import BACKFILL, CATCH_UP, SKIP, UNIQUE_TAG, policies
from tests.integration.stacks import History, judged_run

from evsched.core import ids
from evsched.core.events import JobEnqueued, ScheduleFired
from evsched.core.invariants import Replay
from evsched.core.schedule import policy as cron_policy
from evsched.core.state import Status, Verdict

pytestmark = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.asyncio(loop_scope="module"),
]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def judged(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[History, Replay]:
    """One run of the scenario for the module's tests."""
    return await judged_run(kafka_bootstrap, "pol", tmp_path_factory.mktemp("policies"), policies)


async def test_a_unique_job_is_one_run_at_a_time_and_its_held_enqueue_runs_next(
    judged: tuple[History, Replay],
) -> None:
    events, done = judged
    [job_id] = {
        e.job_id for e, _ in events if isinstance(e, JobEnqueued) and UNIQUE_TAG.encode() in e.args
    }
    enqueues = [e for e in done.job_timelines[job_id] if e.kind == "JobEnqueued"]
    assert [e.verdict for e in enqueues] == [
        Verdict.APPLIED,
        Verdict.DUPLICATE,
        Verdict.APPLIED,
        Verdict.DUPLICATE,
    ]
    assert enqueues[2].reason == "unique while queued: held until run 0 (running) ends"
    assert enqueues[3].reason == "unique while queued: run 1 is already held"
    successes = [e for e in done.job_timelines[job_id] if e.kind == "AttemptSucceeded"]
    assert [e.verdict for e in successes] == [Verdict.APPLIED, Verdict.APPLIED]
    assert successes[0].reason.endswith("; the held enqueue starts run 1")
    state = done.jobs[job_id]
    assert (state.generation, state.status, state.token) == (1, Status.SUCCEEDED, 2)


async def test_a_skip_policy_runs_nothing_more_while_its_slow_job_runs(
    judged: tuple[History, Replay],
) -> None:
    _, done = judged
    job_id = ids.job_id_for_runs(SKIP)
    timeline = done.job_timelines[job_id]
    started = next(i for i, e in enumerate(timeline) if e.kind == "AttemptStarted")
    ended = next(i for i, e in enumerate(timeline) if e.kind == "AttemptSucceeded")
    meanwhile = [e for e in timeline[started:ended] if e.kind == "JobEnqueued"]
    assert len(meanwhile) >= 2
    assert {(e.verdict, e.reason) for e in meanwhile} == {
        (Verdict.DUPLICATE, "unique while queued or running: run 0 is running")
    }
    after = [
        e for e in timeline[ended:] if e.kind == "JobEnqueued" and e.verdict is Verdict.APPLIED
    ]
    assert after and "(run 1: unique while queued or running: run 0 ended" in after[0].reason
    fires = [e for e in done.schedule_timelines[SKIP] if e.kind == "ScheduleFired"]
    assert all("(overlap skip:" in e.reason for e in fires if e.verdict is Verdict.APPLIED)


async def test_after_a_stopped_node_missed_slots_are_skipped_and_the_window_s_caught_up(
    judged: tuple[History, Replay],
) -> None:
    events, done = judged
    fires = [e for e, _ in events if isinstance(e, ScheduleFired) and e.schedule_id == CATCH_UP]
    timeline = [e for e in done.schedule_timelines[CATCH_UP] if e.kind == "ScheduleFired"]
    applied = [f for f, e in zip(fires, timeline, strict=True) if e.verdict is Verdict.APPLIED]
    decisions = [f.decision for f in applied]
    missed = decisions.index(cron_policy.MISSED)
    assert missed >= 2  # fires before the stop
    caught_up = [f for f in applied[missed + 1 :] if f.decision == cron_policy.CAUGHT_UP]
    assert caught_up
    gap = applied[missed + 1].fire_at - applied[missed].fire_at
    assert gap == 2_000  # the first slot in the window follows the last skipped one
    jobs = {
        e.fire_at: e for e, _ in events if isinstance(e, JobEnqueued) and e.schedule_id == CATCH_UP
    }
    assert applied[missed].fire_at not in jobs  # a missed fire makes no job
    for fire in applied:
        if fire.decision != cron_policy.MISSED:
            offset = cron_policy.jitter_ms(CATCH_UP, fire.fire_at, 1_500)
            assert jobs[fire.fire_at].run_at == fire.fire_at + offset
    readings = [e.reason for e in timeline if e.verdict is Verdict.APPLIED]
    assert readings[missed].endswith("outside the 5000 ms catch-up window")


async def test_a_backfill_fires_past_slots_once_and_a_future_one_is_rejected(
    judged: tuple[History, Replay],
) -> None:
    events, done = judged
    backfills = [
        (e, p) for e, p in events if isinstance(e, ScheduleFired) and e.decision == "backfilled"
    ]
    timeline = {(t.partition, t.offset): t for t in done.schedule_timelines[BACKFILL]}
    judged_fires = [(e, timeline[(p.partition, p.offset)]) for e, p in backfills]
    hostile = [t for e, t in judged_fires if e.source == "mallory"]
    assert [(t.verdict, "in the future" in t.reason) for t in hostile] == [(Verdict.REJECTED, True)]
    by_cli = [(e, t) for e, t in judged_fires if e.source != "mallory"]
    slots = sorted({e.fire_at for e, _ in by_cli})
    assert len(by_cli) == 2 * len(slots) and slots  # the same slots, twice
    jobs = [
        (e, done.job_timelines[e.job_id])
        for e, _ in events
        if isinstance(e, JobEnqueued) and e.schedule_id == BACKFILL and e.fire_at in slots
    ]
    for job_id in {e.job_id for e, _ in jobs}:
        verdicts = [t.verdict for t in done.job_timelines[job_id] if t.kind == "JobEnqueued"]
        assert verdicts == [Verdict.APPLIED, Verdict.DUPLICATE]  # one job per slot
        assert done.jobs[job_id].status is Status.SUCCEEDED
