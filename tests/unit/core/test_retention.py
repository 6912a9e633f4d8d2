"""The pure retention rules: when a finished job may be purged, when its key starts a new run,
what the planner proposes, the limits of the new fields, and the invariant checker across runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evsched.core import bounds, retention
from evsched.core.events import (
    AttemptStarted,
    AttemptSucceeded,
    JobEnqueued,
    JobLeased,
    JobPurged,
    Position,
)
from evsched.core.fold import fold
from evsched.core.invariants import replay
from evsched.core.planner import plan_purges
from evsched.core.state import Status, Verdict
from tests.states import job_state

DONE = job_state("done", status=Status.SUCCEEDED, updated_at=1_000, retention_ms=500)


def test_only_a_finished_job_has_a_purge_time() -> None:
    assert retention.purge_at(DONE) == 1_500
    assert retention.purge_at(replace(DONE, retention_ms=None)) == 1_000 + 7 * 86_400_000
    assert retention.purge_at(replace(DONE, status=Status.RUNNING)) is None


@pytest.mark.parametrize(
    ("changes", "log_at", "passed"),
    [
        ({}, 10_000_000, False),  # no key: the id is the producer's, never reused
        ({"idempotency_key": "k", "status": Status.SCHEDULED}, 10_000_000, False),
        ({"idempotency_key": "k", "key_window_ms": 100}, 1_099, False),
        ({"idempotency_key": "k", "key_window_ms": 100}, 1_100, True),
        ({"idempotency_key": "k"}, 1_000 + 86_400_000, True),  # the default: 24 h
    ],
)
def test_the_key_window(changes: dict[str, object], log_at: int, passed: bool) -> None:
    assert retention.key_window_passed(replace(DONE, **changes), log_at) is passed


def test_purge_refusals_name_the_run_the_status_and_the_time() -> None:
    assert retention.purge_refusal(DONE, 1, 9_999) == "cannot purge run 1: the job is at run 0"
    running = replace(DONE, status=Status.RUNNING)
    assert retention.purge_refusal(running, 0, 9_999) == "cannot purge: job is running"
    early = retention.purge_refusal(DONE, 0, 1_499)
    assert early == "cannot purge before its retention ends at 1500 (log time 1499)"
    assert retention.purge_refusal(DONE, 0, 1_500) is None


def test_the_planner_proposes_purges_of_due_finished_jobs_only() -> None:
    later = replace(DONE, job_id="later", retention_ms=10_000)
    active = replace(DONE, job_id="active", status=Status.LEASED)
    (purge,) = plan_purges([DONE, later, active], now=1_500, source="node-1")
    assert (purge.job_id, purge.generation, purge.source) == ("done", 0, "node-1")
    (again,) = plan_purges([DONE], now=2_000, source="node-2")
    assert again.event_id == purge.event_id  # the same decision: a duplicate, never two


def test_the_limits_of_the_new_fields() -> None:
    enqueued = JobEnqueued(
        event_id="e", job_id="j", emitted_at=0, source="s", task="t", queue="q", args=b"[]"
    )
    assert bounds.refusal(replace(enqueued, retention_ms=-1)) == (
        "retention_ms -1 is outside [0, 315619200000]"
    )
    assert bounds.refusal(replace(enqueued, key_window_ms=2**62)) is not None
    purge = JobPurged(event_id="p", job_id="j", emitted_at=0, source="s", generation=-1)
    assert bounds.refusal(purge) == "generation -1 is outside [0, 9007199254740991]"
    state, entry = fold(DONE, purge, Position(partition=0, offset=9, log_at=99_999))
    assert state is DONE and entry.verdict is Verdict.REJECTED


def _run(job_id: str, token: int, args: bytes) -> list[object]:
    meta = {"job_id": job_id, "emitted_at": 0, "source": "s"}
    return [
        JobEnqueued(
            event_id=f"e{token}", task="t", queue="q", args=args, idempotency_key="k",
            key_window_ms=0, retention_ms=0, **meta,
        ),
        JobLeased(event_id=f"l{token}", token=token, attempt=1, lease_ms=1_000, **meta),
        AttemptStarted(event_id=f"s{token}", token=token, worker_id="w", lease_ms=1_000, **meta),
        AttemptSucceeded(event_id=f"o{token}", token=token, result=b"null", **meta),
    ]  # fmt: skip


def test_the_checker_allows_one_success_per_run_and_forgets_a_purged_id() -> None:
    history = [*_run("j", 1, b"[1]"), *_run("j", 2, b"[2]")]  # run 1 after the key window
    history += [JobPurged(event_id="p", job_id="j", emitted_at=0, source="n", generation=1)]
    history += _run("j", 1, b"[3]")  # after the purge: a new job whose tokens start again
    positions = [Position(partition=0, offset=i, log_at=i) for i in range(len(history))]
    done = replay(zip(history, positions, strict=True))  # type: ignore[arg-type]

    assert done.violations == []
    state = done.jobs["j"]
    assert (state.generation, state.token, state.args) == (0, 1, b"[3]")
    verdicts = [e.verdict for e in done.job_timelines["j"]]
    assert verdicts == [Verdict.APPLIED] * len(history)


def test_a_new_run_of_an_id_ends_the_earlier_one_where_it_began() -> None:
    next_run = replace(DONE, status=Status.SCHEDULED, generation=1, updated_at=4_000)
    assert retention.ended_run(None, next_run, 7, 4_000) is None
    assert retention.ended_run(DONE, None, 7, 4_000) is None  # a purge begins no run
    assert retention.ended_run(DONE, replace(DONE, updated_at=4_000), 7, 4_000) is None
    # An enqueue past the key window: it is the new run's first entry; the run ended at 1_000.
    ended = retention.ended_run(DONE, next_run, 7, 4_000)
    assert ended == retention.EndedRun(boundary=7, kept_until=1_500, base=DONE)
    # A success that starts the held run: it is the ended run's last entry, ending it now.
    running = replace(DONE, status=Status.RUNNING, updated_at=900)
    held = retention.ended_run(running, next_run, 7, 4_000)
    assert held == retention.EndedRun(boundary=8, kept_until=4_500, base=next_run)
