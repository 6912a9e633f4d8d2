"""The roles table and the fold's rule for facts that need a proof (core.roles, fold version 9)."""

from __future__ import annotations

import pytest

from evsched.core import roles, tallies
from evsched.core.events import (
    EVENT_TYPES,
    AttemptSucceeded,
    JobCancelled,
    JobEnqueued,
    JobLeased,
    PermitGranted,
    Position,
    Role,
    ScheduleFired,
)
from evsched.core.fold import fold
from evsched.core.permits import fold_permit
from evsched.core.schedule.fold import fold_schedule
from evsched.core.state import FoldedEvent, Status, Verdict

REQUIRED = Position(partition=0, offset=5, log_at=1_000, proofs_required=True)
OLD = Position(partition=0, offset=5, log_at=1_000)  # before the partition's first proof


def _enqueued(job_id: str = "j") -> JobEnqueued:
    return JobEnqueued(
        event_id="e1", job_id=job_id, emitted_at=0, source="client", task="t", queue="default",
        args=b"[]",
    )  # fmt: skip


def _leased(token: int = 1) -> JobLeased:
    return JobLeased(
        event_id="l1", job_id="j", emitted_at=0, source="node-x", token=token, attempt=1,
        lease_ms=30_000,
    )  # fmt: skip


def _fired(decision: str | None) -> ScheduleFired:
    return ScheduleFired(
        event_id="f1", schedule_id="s", emitted_at=0, source="node-x", fire_at=0, job_id="s-0",
        decision=decision,
    )  # fmt: skip


def test_every_kind_has_its_roles_and_the_proven_ones_are_the_node_and_worker_facts() -> None:
    assert set(roles.STATED_BY) == set(EVENT_TYPES)
    proven = {cls.__name__: role.value for cls, role in roles.PROOF_ROLE.items()}
    assert proven == {
        "JobLeased": "node", "LeaseExpired": "node", "JobPurged": "node",
        "ParentResolved": "node", "PermitRequested": "node", "PermitGranted": "node",
        "QueuePermit": "node", "ScheduleFired": "node", "AttemptStarted": "worker",
        "LeaseRenewed": "worker",
        "AttemptCheckpointed": "worker", "AttemptSucceeded": "worker", "AttemptFailed": "worker",
        "AttemptSnoozed": "worker",
    }  # fmt: skip


def test_before_proofs_are_required_nothing_is_refused_for_want_of_one() -> None:
    assert roles.refusal(_leased(), OLD) is None


def test_a_node_fact_without_a_node_proof_is_refused_once_proofs_are_required() -> None:
    why = roles.refusal(_leased(), REQUIRED)
    assert why == (
        "unproven: a JobLeased is stated by a node only, and this one carries no valid node proof"
    )
    assert why is not None and roles.is_unproven(why)


def test_a_proof_of_the_wrong_role_proves_nothing() -> None:
    as_worker = Position(partition=0, offset=5, log_at=1, proofs_required=True, proven=Role.WORKER)
    assert roles.refusal(_leased(), as_worker) is not None
    as_node = Position(partition=0, offset=5, log_at=1, proofs_required=True, proven=Role.NODE)
    assert roles.refusal(_leased(), as_node) is None


def test_producer_kinds_and_an_operators_backfill_need_no_proof() -> None:
    cancel = JobCancelled(event_id="c", job_id="j", emitted_at=0, source="cli")
    assert roles.refusal(cancel, REQUIRED) is None
    assert roles.refusal(_enqueued(), REQUIRED) is None
    assert roles.refusal(_fired("backfilled"), REQUIRED) is None
    assert roles.refusal(_fired(None), REQUIRED) is not None
    assert roles.refusal(_fired("caught_up"), REQUIRED) is not None


def test_the_job_fold_rejects_an_unproven_lease_and_applies_a_proven_one() -> None:
    state, _ = fold(None, _enqueued(), OLD)
    assert state is not None
    after, entry = fold(state, _leased(), REQUIRED)
    assert (entry.verdict, after) == (Verdict.REJECTED, state)
    assert roles.is_unproven(entry.reason)
    proven = Position(partition=0, offset=6, log_at=1_000, proofs_required=True, proven=Role.NODE)
    after, entry = fold(state, _leased(), proven)
    assert entry.verdict is Verdict.APPLIED and after is not None
    assert after.status is Status.LEASED


def test_a_forged_completion_with_the_live_token_is_rejected() -> None:
    state, _ = fold(None, _enqueued(), OLD)
    node = Position(partition=0, offset=6, log_at=1_000, proofs_required=True, proven=Role.NODE)
    state, _ = fold(state, _leased(), node)
    success = AttemptSucceeded(
        event_id="s1", job_id="j", emitted_at=0, source="forger", token=1, result=b"1"
    )
    after, entry = fold(state, success, REQUIRED)
    assert entry.verdict is Verdict.REJECTED and after == state


def test_the_schedule_and_permit_folds_ask_for_proofs_too() -> None:
    _, entry = fold_schedule(None, _fired(None), REQUIRED)
    assert roles.is_unproven(entry.reason)
    grant = PermitGranted(
        event_id="g", job_id="j", emitted_at=0, source="forger", queue="default", key=None
    )
    _, entry, forward = fold_permit(None, None, grant, REQUIRED)
    assert entry.verdict is Verdict.REJECTED and roles.is_unproven(entry.reason)
    assert forward is None  # an unproven grant granted nothing: no release goes to the home
    _, entry, forward = fold_permit(None, None, grant, OLD)  # a real grant nobody can use
    assert entry.verdict is Verdict.REJECTED and forward is not None


@pytest.mark.parametrize("reason", ["lease token 2, expected token 1", "unproven"])
def test_only_a_refusal_for_want_of_a_proof_reads_as_unproven(reason: str) -> None:
    assert not roles.is_unproven(reason)


def test_an_unproven_refusal_is_tallied() -> None:
    state, _ = fold(None, _enqueued(), OLD)
    _, entry = fold(state, _leased(), REQUIRED)
    assert tallies.tallied(FoldedEvent(entry, state, state)) == (tallies.UNPROVEN,)
