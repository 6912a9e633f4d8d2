"""A handler's Snooze end to end: real node and worker processes on the real broker (issue 35).

A job snoozed twice runs once more after each delay and succeeds at attempt 1; a job snoozed
while its node is SIGKILLed still runs once, after its delay, under the node that takes over.
Each test ends with I1/I6/I7 and the effects checked on the log read back.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.integration.engine import Stack, wait_for
from tests.integration.stacks import node_and_worker

from evsched.core.state import Status, TimelineEntry, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow]
TWICE_DELAY_S = 1.5
KILL_DELAY_S = 8.0


@pytest.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    async with node_and_worker(kafka_bootstrap, "snooze", tmp_path, check=True) as engine:
        yield engine


def _applied(timeline: list[TimelineEntry], kind: str) -> list[TimelineEntry]:
    return [e for e in timeline if e.kind == kind and e.verdict is Verdict.APPLIED]


def _starts_after_snoozes(timeline: list[TimelineEntry]) -> list[tuple[int, int]]:
    """(snooze's log time, next applied start's log time) for each applied snooze."""
    pairs = []
    for i, entry in enumerate(timeline):
        if entry.kind == "AttemptSnoozed" and entry.verdict is Verdict.APPLIED:
            start = next(
                e
                for e in timeline[i:]
                if e.kind == "AttemptStarted" and e.verdict is Verdict.APPLIED
            )
            pairs.append((entry.log_at, start.log_at))
    return pairs


async def test_a_job_snoozed_twice_succeeds_at_attempt_one_after_each_delay(stack: Stack) -> None:
    marks = stack.tmp / "twice"
    marks.mkdir()
    async with stack.app() as app:
        job_id = await app.enqueue("s.snooze", str(marks), 2, TWICE_DELAY_S)
    state = await stack.wait_status(job_id, Status.SUCCEEDED)
    assert (state.attempt, state.token, state.snoozes, state.snoozed_until) == (1, 3, 2, None)
    assert sorted(p.name for p in marks.iterdir()) == [
        "run-1-attempt-1-token-1",
        "run-2-attempt-1-token-2",
        "run-3-attempt-1-token-3",
    ]
    timeline = await stack.timeline(job_id)
    snoozes = _applied(timeline, "AttemptSnoozed")
    assert [s.status_after for s in snoozes] == [Status.SCHEDULED, Status.SCHEDULED]
    assert [s.reason.split(": ")[-1] for s in snoozes] == ["snooze 1 of 2", "snooze 2 of 2"]
    assert all(f"for {int(TWICE_DELAY_S * 1000)} ms" in s.reason for s in snoozes)
    pairs = _starts_after_snoozes(timeline)
    assert len(pairs) == 2
    # Start lateness honours the delay: no start before the snooze's log time + its delay.
    assert all(start - snoozed >= TWICE_DELAY_S * 1000 for snoozed, start in pairs), pairs


async def test_a_capped_snooze_fails_the_attempt_and_the_job_dies(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.enqueue("s.snooze_capped")
    state = await stack.wait_status(job_id, Status.DEAD)
    assert state.last_error is not None
    assert (state.last_error.error_type, state.last_error.category) == (
        "evsched.SnoozeLimit", "snooze_limit",
    )  # fmt: skip
    assert (state.attempt, state.snoozes) == (2, 1)
    kinds = [
        (e.kind, e.status_after) for e in _applied(await stack.timeline(job_id), "AttemptSnoozed")
    ]
    assert kinds == [
        ("AttemptSnoozed", Status.SCHEDULED),  # within the cap of 1
        ("AttemptSnoozed", Status.SCHEDULED),  # past it: attempt 1 failed, retried
        ("AttemptSnoozed", Status.DEAD),  # attempt 2 failed, none left
    ]


async def test_a_snoozed_job_runs_once_after_its_delay_through_a_node_kill(stack: Stack) -> None:
    marks = stack.tmp / "killed"
    marks.mkdir()
    async with stack.app() as app:
        job_id = await app.enqueue("s.snooze", str(marks), 1, KILL_DELAY_S)

    async def snoozed() -> bool:
        state = await stack.job(job_id)
        return state is not None and state.snoozed_until is not None

    await wait_for(snoozed, what="the job's snooze applied", timeout_s=240)
    (node,) = [p for p in stack.procs if p.name == "node-1"]
    node.kill()
    stack.start_node("node-2", "--dispatch-timeout-s", "10")
    state = await stack.wait_status(job_id, Status.SUCCEEDED, timeout_s=240)
    assert (state.attempt, state.token, state.snoozes) == (1, 2, 1)
    # Once snoozed, once run: the kill neither lost the job nor ran it twice.
    assert sorted(p.name for p in marks.iterdir()) == [
        "run-1-attempt-1-token-1",
        "run-2-attempt-1-token-2",
    ]
    timeline = await stack.timeline(job_id)
    ((snoozed_at, started_at),) = _starts_after_snoozes(timeline)
    assert started_at - snoozed_at >= KILL_DELAY_S * 1000
    (lease,) = [e for e in _applied(timeline, "JobLeased") if e.token == 2]
    assert lease.source == "node-node-2"
