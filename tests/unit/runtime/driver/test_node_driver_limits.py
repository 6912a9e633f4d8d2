"""Issue 9 A.1-A.3 and C.7 through NodeDriver (moved from tests/integration/test_fold_limits.py,
which needed a broker, a node and a worker process for what is the partition's own behaviour).

A forged event beyond the fold's limits (a 70 kB id, a queue no topic can be named after, a lease
token or duration that overflows) used to halt its partition for good; now it is refused and the
partition goes on. A lease that expires before any worker started it spends no attempt.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from evsched.core.events import Event, JobEnqueued, JobLeased, LeaseExpired, ScheduleDeleted
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status, Verdict
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import enqueued, started, succeeded

META = {"emitted_at": 0, "source": "forger"}


def forged() -> list[Event]:
    base = JobEnqueued(
        event_id="f0", job_id="forged", task="s.noop", queue="default", args=b"{}", **META
    )
    return [
        replace(base, event_id="f1", job_id="j" * 70_000),
        ScheduleDeleted(event_id="f2", schedule_id="s" * 70_000, **META),
        replace(base, event_id="f3", queue="bad queue!"),
        replace(base, event_id="f4", queue="q" * 300),
        replace(base, event_id="f5", run_at=2**63 - 1),
        JobLeased(event_id="f6", job_id="forged", token=2**63 - 1, attempt=1, lease_ms=1, **META),
        JobLeased(event_id="f7", job_id="forged", token=9, attempt=1, lease_ms=2**63 - 1, **META),
    ]


async def test_forged_events_beyond_the_limits_are_refused_and_the_partition_goes_on(
    tmp_path: Path,
) -> None:
    driver = NodeDriver(tmp_path)
    driver.append(*forged(), enqueued("ok"))
    await driver.settle()
    [dispatch] = driver.dispatched()
    driver.append(started(dispatch), succeeded(dispatch))
    await driver.settle()
    done = driver.job("ok")
    assert done is not None and done.status is Status.SUCCEEDED
    index = driver.owner.index
    refused = [(e.kind, e.verdict, e.reason) for e, _ in index.refused()]
    assert refused == [
        (
            "JobEnqueued",
            Verdict.REJECTED,
            "job_id has 70000 UTF-8 bytes, above the limit of 1024",
        ),
        (
            "ScheduleDeleted",
            Verdict.REJECTED,
            "schedule_id has 70000 UTF-8 bytes, above the limit of 1024",
        ),
    ]
    reasons = [e.reason for e in index.timeline("forged")]
    assert [r.split(" ")[0] for r in reasons] == ["queue", "queue", "run_at", "token", "lease_ms"]
    assert index.job("forged") is None  # every enqueue of it was refused
    assert index.applied_offset() == driver.log()[-1].offset
    driver.close()


async def test_a_lease_that_expires_unstarted_spends_no_attempt(tmp_path: Path) -> None:
    driver = NodeDriver(tmp_path, budgets=PlannerBudgets(dispatch_timeout_ms=2_000))
    driver.append(enqueued("j", max_attempts=3))  # three attempts; no worker yet
    await driver.settle()
    for _ in range(4):
        driver.advance(2)
        await driver.settle()
    expiries = [e for e in driver.job_timeline("j") if e.kind == "LeaseExpired"]
    assert len(expiries) == 4 and all(e.verdict is Verdict.APPLIED for e in expiries)
    assert len(driver.decisions(LeaseExpired)) == 4
    state = driver.job("j")
    assert state is not None and state.status is not Status.DEAD  # it was dead after 3
    last = driver.dispatched()[-1]
    driver.append(started(last, lease_ms=3_000), succeeded(last))
    await driver.settle()
    done = driver.job("j")
    assert done is not None and done.status is Status.SUCCEEDED
    assert done.attempt == 1 and done.token >= 5
    driver.close()
