"""Facts that need a proof of role, through NodeDriver (issue 32, item 1; fold version 9).

A node with keys proves its decisions and gives each dispatch its lease's key; once the partition
has seen a proven record, the forged facts of the review (a lease at the largest token, a parent's
resolution, a completion with the live token, a permit grant and release, a 10-year lease) are
rejected as unproven, and the worker's proven attempt runs the job to success.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.proofs import PROOF_HEADER, NodeKeyring, generate_key, worker_proof
from evsched.core import roles
from evsched.core.bounds import MAX_TOKEN
from evsched.core.dispatch import Dispatch
from evsched.core.events import (
    Event,
    JobLeased,
    LeaseExpired,
    ParentResolved,
    PermitGranted,
    QueuePermit,
    entity_id,
)
from evsched.core.planner import PlannerBudgets
from evsched.core.state import Status, Verdict
from evsched.core.tallies import PROOFS_REQUIRED, UNPROVEN
from evsched.runtime.projection.projector import Projector
from evsched.testing import NodeDriver
from tests.unit.node_driver_events import enqueued, started, succeeded

KEYS = NodeKeyring(generate_key())


@pytest.fixture
def proving(tmp_path: Path) -> Iterator[NodeDriver]:
    node = NodeDriver(
        tmp_path / "node", budgets=PlannerBudgets(dispatch_timeout_ms=30_000), keyring=KEYS
    )
    yield node
    node.close()


def as_worker(driver: NodeDriver, dispatch: Dispatch, *events: Event) -> None:
    """Append a worker's events proven with the dispatch's lease key, as the worker does."""
    assert dispatch.lease_key is not None
    for event in events:
        value = avro.encode_event(event)
        proof = (PROOF_HEADER, worker_proof(dispatch.lease_key, value))
        driver.append_raw(value, key=entity_id(event).encode(), headers=(proof,))


def verdicts(driver: NodeDriver, job_id: str) -> list[tuple[str, Verdict, bool]]:
    return [(e.kind, e.verdict, roles.is_unproven(e.reason)) for e in driver.job_timeline(job_id)]


async def test_the_nodes_decisions_carry_its_proof_and_its_dispatches_a_lease_key(
    proving: NodeDriver,
) -> None:
    proving.append(enqueued("a"))
    await proving.settle()
    [lease] = [r for r in proving.sent(proving.topics.events)]
    event = avro.decode_event(lease.value or b"")
    assert isinstance(event, JobLeased)
    [proof] = [v for k, v in lease.headers if k == PROOF_HEADER]
    assert KEYS.proven(event, lease.value or b"", proof) is not None
    [dispatch] = proving.dispatched()
    assert dispatch.lease_key == KEYS.lease_key("a", 1)
    assert proving.owner.index.tallies()[PROOFS_REQUIRED] == 1


async def test_forged_facts_are_rejected_and_the_proven_attempt_succeeds(
    proving: NodeDriver,
) -> None:
    proving.append(
        enqueued("victim"),
        enqueued("child"),
        enqueued("idle", run_at=proving.clock.now_ms() + 3_600_000),
    )
    await proving.settle()
    [dispatch] = [d for d in proving.dispatched() if d.job_id == "victim"]
    forger = "node-forger"
    proving.append(
        # A completion with the live token: every JobLeased on the log shows it.
        succeeded(dispatch),
        JobLeased(
            event_id="forged-lease", job_id="idle", emitted_at=0, source=forger, token=1,
            attempt=1, lease_ms=10 * 365 * 86_400_000,
        ),
        JobLeased(
            event_id="forged-max", job_id="idle", emitted_at=0, source=forger, token=MAX_TOKEN,
            attempt=1, lease_ms=1,
        ),
        LeaseExpired(
            event_id="forged-expiry", job_id="victim", emitted_at=0, source=forger, token=1
        ),
        ParentResolved(
            event_id="forged-parent", job_id="child", emitted_at=0, source=forger,
            parent_id="victim", outcome="dead", parent_partition=0, parent_offset=0,
        ),
        PermitGranted(
            event_id="forged-grant", job_id="child", emitted_at=0, source=forger,
            queue="default", key=None,
        ),
        QueuePermit(
            event_id="forged-release", queue="default", key=None, job_id="victim",
            emitted_at=0, source=forger, action="release",
        ),
    )  # fmt: skip
    await proving.settle()
    assert verdicts(proving, "victim")[-2:] == [
        ("AttemptSucceeded", Verdict.REJECTED, True),
        ("LeaseExpired", Verdict.REJECTED, True),
    ]
    assert verdicts(proving, "idle")[-2:] == [
        ("JobLeased", Verdict.REJECTED, True),
        ("JobLeased", Verdict.REJECTED, True),
    ]
    assert ("ParentResolved", Verdict.REJECTED, True) in verdicts(proving, "child")
    assert ("PermitGranted", Verdict.REJECTED, True) in verdicts(proving, "child")
    assert proving.owner.index.tallies()[UNPROVEN] >= 6
    victim = proving.job("victim")
    assert victim is not None and victim.status is Status.LEASED
    # The worker's own events, proven with its lease's key.
    as_worker(proving, dispatch, started(dispatch), succeeded(dispatch))
    await proving.settle()
    victim = proving.job("victim")
    assert victim is not None and victim.status is Status.SUCCEEDED
    idle = proving.job("idle")
    assert idle is not None and (idle.status, idle.token) == (Status.SCHEDULED, 0)


async def test_a_lease_key_proves_nothing_for_another_job(proving: NodeDriver) -> None:
    proving.append(enqueued("a"), enqueued("b"))
    await proving.settle()
    by_job = {d.job_id: d for d in proving.dispatched()}
    stolen = Dispatch(**{**_fields(by_job["b"]), "lease_key": by_job["a"].lease_key})
    as_worker(proving, stolen, started(stolen))
    await proving.settle()
    assert verdicts(proving, "b")[-1] == ("AttemptStarted", Verdict.REJECTED, True)


async def test_the_requirement_outlives_the_process(proving: NodeDriver, tmp_path: Path) -> None:
    proving.append(enqueued("a"))
    await proving.settle()
    proving.close()
    index = PartitionIndex(tmp_path / "node" / "p0000", 0)
    try:
        assert Projector(index, keyring=KEYS).proofs.required
        assert not Projector(index, keyring=None).proofs.required  # no keys: no checks
    finally:
        index.close()


async def test_a_node_without_keys_proves_nothing_and_requires_nothing(driver: NodeDriver) -> None:
    driver.append(enqueued("a"))
    await driver.settle()
    [dispatch] = driver.dispatched()
    assert dispatch.lease_key is None
    assert all(not r.headers for r in driver.sent(driver.topics.events))
    driver.append(started(dispatch), succeeded(dispatch))
    await driver.settle()
    state = driver.job("a")
    assert state is not None and state.status is Status.SUCCEEDED


def _fields(dispatch: Dispatch) -> dict[str, object]:
    return {name: getattr(dispatch, name) for name in Dispatch.__dataclass_fields__}
