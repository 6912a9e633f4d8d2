"""A group of 1,000 members spread over every events partition, with a callback, on the real
broker: one node, one worker with high concurrency (as lean as the stack allows).

The whole group (1,001 enqueues and 1,000 registrations) is one transaction; each member's node
sends the callback one resolution; the callback fires exactly once, with the 1,000 results in
member order. Judged from the log, with I1-I8 over all of it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Stack
from tests.integration.workflow_log import judge

from evsched.adapters.ids import new_id
from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import group
from evsched.core.state import Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(600)]

MEMBERS = 1_000


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("wfwide")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path)
    engine.start_node("node-1", "--max-unstarted", "500")
    engine.start_worker("worker-1", "--lease-s", "10", "--concurrency", "200")
    try:
        yield engine
    finally:
        await engine.close()


async def test_a_callback_over_1000_members_on_every_partition_fires_exactly_once(
    stack: Stack,
) -> None:
    began = time.monotonic()
    async with stack.app() as app:
        plus, total = app.get_task("s.plus"), app.get_task("s.total")
        members = [plus.s(i, 0) for i in range(MEMBERS)]
        handle = await app.enqueue_workflow(group(members, callback=total.s()), key=new_id())
        assert await handle.last.result(timeout=400) == sum(range(MEMBERS))
    *jobs, callback = handle.job_ids
    assert {j.enqueue_partition for j in handle.jobs[:-1]} == set(range(stack.partitions))
    state = await stack.wait_status(callback, Status.SUCCEEDED)
    assert json.loads(state.args)["args"] == [list(range(MEMBERS))]  # member order
    ran_s = time.monotonic() - began

    judged = await judge(stack)
    resolved = judged.resolutions(callback)
    assert Counter(e.parent_id for e, _ in resolved) == Counter(jobs)  # one each, no more
    assert {t.verdict for _, t in resolved} == {Verdict.APPLIED}
    for parent in jobs:  # each names its member's one accepted end, partition@offset
        judged.released_once_by_the_end(callback, parent)
    assert len(judged.of(callback, "JobLeased", Verdict.APPLIED)) == 1
    assert len(judged.of(callback, "AttemptStarted")) == 1
    assert len(judged.of(callback, "AttemptSucceeded", Verdict.APPLIED)) == 1
    print(f"1,000-member group with a callback: {ran_s:.1f} s from enqueue to the callback's end")
