"""Pause and resume on the real broker with real node and worker processes, judged from the log.

The run is the ``controls`` replay scenario (``replay/scenario_controls.py``); here the log it
leaves is checked: no lease of the paused queue's jobs was applied between the pause and the
resume on any partition, the zombie's lease and fire were rejected, the running job finished,
and the paused schedule's missed slots collapsed into one fire on resume.
"""

from __future__ import annotations

import pytest
import pytest_asyncio
from replay.scenario_controls import controls
from tests.integration.stacks import History, judged_run

from evsched.core.events import (
    QueuePaused,
    QueueResumed,
    ScheduleFired,
    SchedulePaused,
    ScheduleResumed,
)
from evsched.core.invariants import Replay
from evsched.core.state import TimelineEntry, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def judged(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[History, Replay]:
    """One run of the scenario for the module's tests."""
    return await judged_run(kafka_bootstrap, "ctl", tmp_path_factory.mktemp("controls"), controls)


def _entries(done: Replay) -> list[TimelineEntry]:
    return [e for timeline in done.job_timelines.values() for e in timeline]


async def test_a_paused_queue_gets_no_lease_on_any_partition(
    judged: tuple[History, Replay],
) -> None:
    events, done = judged
    for partition in range(3):
        here = [(p.offset, e) for e, p in events if p.partition == partition]
        pauses = [o for o, e in here if isinstance(e, QueuePaused)]
        resumes = [o for o, e in here if isinstance(e, QueueResumed)]
        assert len(pauses) == 2 and len(resumes) == 2  # each control went to every partition
        applied = [
            e
            for e in _entries(done)
            if e.partition == partition and e.kind == "JobLeased" and e.verdict is Verdict.APPLIED
        ]
        assert not [e for e in applied if pauses[0] < e.offset < resumes[0]]
    zombie = [(e.verdict, e.reason) for e in _entries(done) if e.source == "node-zombie"]
    assert zombie == [(Verdict.REJECTED, "cannot lease: queue default is paused")]
    running = [e for e in _entries(done) if e.kind == "AttemptSucceeded"]
    assert running  # the job running at the pause finished (check() saw every job terminal)


async def test_a_paused_schedule_fires_only_its_latest_missed_slot_on_resume(
    judged: tuple[History, Replay],
) -> None:
    events, done = judged
    paused = next(
        p for e, p in events if isinstance(e, SchedulePaused) and e.schedule_id == "every-2s"
    )
    resumed = next(p for e, p in events if isinstance(e, ScheduleResumed))
    verdict = {e.offset: e.verdict for e in done.schedule_timelines["every-2s"]}
    fires = [(p, e) for e, p in events if isinstance(e, ScheduleFired)]
    applied = [e.fire_at for p, e in fires if verdict[p.offset] is Verdict.APPLIED]
    zombie = [verdict[p.offset] for p, e in fires if e.source == "node-zombie"]
    assert zombie == [Verdict.REJECTED]
    # No slot between the pause and the latest slot before the resume fired.
    assert not [at for at in applied if paused.log_at < at < resumed.log_at - 2_000]
    after = [at for at in applied if at > paused.log_at]
    assert after and after[0] >= resumed.log_at - 2_000
