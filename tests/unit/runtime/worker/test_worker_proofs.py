"""A worker proves its attempt's events with the key its dispatch carried (adapters.proofs)."""

from __future__ import annotations

import pytest

from evsched.adapters.proofs import PROOF_HEADER, NodeKeyring, generate_key
from evsched.core.events import AttemptStarted, AttemptSucceeded, Role
from tests.unit.worker_rig import Rig, make_rig

KEYS = NodeKeyring(generate_key())


@pytest.fixture
def rig() -> Rig:
    return make_rig()


async def test_every_attempt_event_carries_a_proof_the_nodes_accept(rig: Rig) -> None:
    @rig.app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    job = "job-1"
    dispatch = rig.send("add", 2, 3, token=4, lease_key=KEYS.lease_key(job, 4))
    async with rig.worker(lease_ms=30_000):
        await rig.outcome(dispatch.job_id)
    written = [r for r in rig.log.records if r.key == job]
    kinds = [type(r.event) for r in written]
    assert kinds == [AttemptStarted, AttemptSucceeded]
    for record in written:
        [proof] = [v for k, v in record.headers if k == PROOF_HEADER]
        assert KEYS.proven(record.event, record.value, proof) is Role.WORKER


async def test_a_dispatch_without_a_lease_key_makes_unproven_events(rig: Rig) -> None:
    @rig.app.task(name="noop")
    def noop() -> None:
        return None

    dispatch = rig.send("noop")
    async with rig.worker(lease_ms=30_000):
        await rig.outcome(dispatch.job_id)
    assert all(not r.headers for r in rig.log.records)
