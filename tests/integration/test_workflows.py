"""Workflows end to end on the real broker: a real node and worker, three events partitions.

A chain passes results through a retried step; a group's callback over members on every
partition fires once with their results in member order; a zombie parent's stale success
releases nothing. Every test ends with the log checked (I1/I6/I7 and I8: each child released
once per parent, only by an accepted end).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Stack, wait_for

from evsched.adapters import avro
from evsched.adapters.ids import new_id
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.topics import ensure_topics
from evsched.adapters.proofs import PROOF_HEADER, worker_proof
from evsched.client import chain, group
from evsched.core.events import AttemptSucceeded, ParentResolved
from evsched.core.state import Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    namespace = unique_name("wf")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path_factory.mktemp("wf"))
    engine.start_node("node-1", "--dispatch-timeout-s", "5")
    engine.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    try:
        yield engine
    finally:
        await engine.close()


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def checked(stack: Stack) -> AsyncIterator[None]:
    yield
    await stack.check(all_terminal=False)


async def resolutions(stack: Stack, child: str) -> list[ParentResolved]:
    events, _ = await stack.history()
    return [e for e, _ in events if isinstance(e, ParentResolved) and e.job_id == child]


async def test_a_chain_with_a_retry_in_the_middle(stack: Stack) -> None:
    async with stack.app() as app:
        plus = app.get_task("s.plus")
        handle = await app.enqueue_workflow(chain(plus.s(1, 0), plus.s(10, 1), plus.s(100, 0)))
        assert await handle.last.result(timeout=120) == 111
    a, b, c = handle.job_ids
    middle = await stack.wait_status(b, Status.SUCCEEDED)
    assert middle.attempt == 2  # failed once, retried, then passed its result on
    for child, parent in ((b, a), (c, b)):
        [resolution] = await resolutions(stack, child)
        assert resolution.parent_id == parent
    audit = [e for e in await stack.timeline(c) if e.kind == "ParentResolved"]
    assert [e.verdict for e in audit] == [Verdict.APPLIED]


async def test_a_group_callback_over_every_partition_fires_once(stack: Stack) -> None:
    count = 24
    async with stack.app() as app:
        plus, total = app.get_task("s.plus"), app.get_task("s.total")
        members = [plus.s(i, 0) for i in range(count)]
        handle = await app.enqueue_workflow(group(members, callback=total.s()), key=new_id())
        assert await handle.last.result(timeout=120) == sum(range(count))
        *jobs, callback = handle.job_ids
        assert {j.enqueue_partition for j in handle.jobs[:-1]} == {0, 1, 2}
    state = await stack.wait_status(callback, Status.SUCCEEDED)
    assert json.loads(state.args)["args"] == [list(range(count))]  # member order
    found = await resolutions(stack, callback)
    assert sorted(r.parent_id for r in found) == sorted(jobs)  # one per member, no more
    applied = [e for e in await stack.timeline(callback) if e.kind == "JobLeased"]
    assert len(applied) == 1  # ran once


async def test_a_zombie_parents_stale_success_releases_nothing(
    stack: Stack, tmp_path: Path
) -> None:
    async with stack.app() as app:
        gated, noop = app.get_task("s.gated"), app.get_task("s.noop")
        parent = await gated.enqueue(str(tmp_path), "parent")
        child = await noop.options(after=[parent]).enqueue()

        async def started() -> bool:
            return await asyncio.to_thread(lambda: any(tmp_path.glob("started-*")))

        await wait_for(started, what="the parent to start", timeout_s=60)
        running = await stack.wait_status(parent, Status.RUNNING)
        zombie = AttemptSucceeded(
            event_id=new_id(), job_id=parent, emitted_at=0, source="worker-zombie",
            token=running.token - 1, result=b'"forged"',
        )  # fmt: skip
        # A real zombie's report: proven with the key of the lease it held (adapters.proofs).
        value = avro.encode_event(zombie)
        proof = worker_proof(stack.keyring.lease_key(parent, zombie.token), value)
        producer = kafka.producer(stack.settings, client_id="it-zombie")
        await producer.start()
        try:
            await producer.send_and_wait(
                stack.topics.events, value, key=parent.encode(), headers=[(PROOF_HEADER, proof)]
            )
        finally:
            await producer.stop()

        async def judged() -> bool:
            return any(e.source == "worker-zombie" for e in await stack.timeline(parent))

        await wait_for(judged, what="the zombie's success to be folded", timeout_s=60)
        assert (await stack.wait_status(child, Status.WAITING)).status is Status.WAITING
        assert await resolutions(stack, child) == []
        (tmp_path / "go").touch()
        await stack.wait_status(child, Status.SUCCEEDED)
    [resolution] = await resolutions(stack, child)
    assert resolution.outcome == "succeeded" and resolution.result == b'"parent"'
    stale = [e for e in await stack.timeline(parent) if e.source == "worker-zombie"]
    assert [e.verdict for e in stale] == [Verdict.STALE]
