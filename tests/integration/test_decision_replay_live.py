"""``evsched replay --decisions --partition P --from/--to`` on the live log of a running engine: a
real node's decisions replay identical with the planner, and a range is judged from the state
folded before it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from tests.integration.engine import Operator, Stack
from tests.integration.stacks import node_and_worker

from evsched.core.state import Status

pytestmark = [pytest.mark.broker, pytest.mark.slow]

WAVE = 6


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    async with node_and_worker(kafka_bootstrap, "decide", tmp_path) as engine:
        yield engine


async def test_a_live_nodes_decisions_replay_identical_by_partition_and_range(
    stack: Stack,
) -> None:
    op = Operator(stack)
    first = await _wave(op, stack)
    second = await _wave(op, stack)  # enqueued after the first wave's leases
    jobs = first + second
    decide = ("replay", "--decisions", "--dispatch-timeout-ms", "10000")  # the stack's node
    leases = 0
    for partition in range(stack.partitions):
        mine = [j for j in jobs if j["partition"] == partition]
        if mine:  # its lease and the worker's events are in the log once the job succeeded
            await stack.wait_node_past(partition, max(j["offset"] for j in mine))
        (report,) = await op.json(*decide, "--partition", str(partition))
        assert report["identical"], report["divergences"]
        assert report["judged"]["lease"] >= len(mine) and report["refused"] == 0
        leases += report["judged"]["lease"]
    assert leases >= len(jobs)

    partition, since = second[0]["partition"], second[0]["offset"]  # the first wave has one too
    (whole,) = await op.json(*decide, "--partition", str(partition))
    (later,) = await op.json(*decide, "--partition", str(partition), "--from", str(since))
    assert later["identical"], later["divergences"]
    assert 0 < later["judged"]["lease"] < whole["judged"]["lease"]

    code, output = await op.run(*decide, "--partition", "9")
    assert code == 2 and "partition 9 is not in 0..2" in output
    code, output = await op.run("replay", "--decisions", "--partition", "0", "--prelease-ms", "0")
    assert code in (0, 1)  # another setting judges; the node's 1 s pre-lease may show
    code, output = await op.run("replay", "--from", "3")
    assert code == 2 and "add --partition" in " ".join(output.split())


async def _wave(op: Operator, stack: Stack) -> list[dict[str, Any]]:
    """At least ``WAVE`` jobs of three priorities, one on every partition at least, enqueued at
    once, then run to success."""
    jobs: list[dict[str, Any]] = []
    while len(jobs) < WAVE or len({j["partition"] for j in jobs}) < stack.partitions:
        priority = str(len(jobs) % 3)
        jobs += await op.json("enqueue", "s.noop", "--priority", priority, "--no-wait")
    for job in jobs:
        await stack.wait_status(job["id"], Status.SUCCEEDED)
    return jobs
