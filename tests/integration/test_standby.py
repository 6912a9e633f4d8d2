"""A standby node on real processes: node-b runs ``--standby`` beside node-a, node-a is SIGKILLed,
and node-b opens node-a's partitions from its warm copies (USE_LOCAL, a short tail, no restore,
rebuild or seed), every job still runs once, and ``rebuild --verify`` matches its indexes."""

from __future__ import annotations

import asyncio
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, logged, wait_for

from evsched.adapters.kafka.groups import partition_owners
from evsched.adapters.kafka.topics import Topics, ensure_topics
from evsched.core.state import TERMINAL_STATUSES, Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PARTITIONS = 2
METRICS_PORT = 19991  # this helper's range: 19990-19999
# The records a take-over may fold from the standby copy: those past the group's last offset.
MAX_TAIL = 500
NO_RESTORE = ("partition_index_restored", "partition_index_rebuilt", "partition_changelog_seeded")


@pytest.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("standby")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=PARTITIONS, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path, partitions=PARTITIONS)
    try:
        yield engine
    finally:
        await engine.close()


async def settled(stack: Stack, job_ids: list[str]) -> bool:
    states = [await stack.job(j) for j in job_ids]
    return all(s is not None and s.status in TERMINAL_STATUSES for s in states)


def standby_lag() -> dict[int, float]:
    """node-b's evsched_node_standby_lag_records, per partition."""
    with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5) as page:
        text = page.read().decode()
    lag: dict[int, float] = {}
    for line in text.splitlines():
        if line.startswith("evsched_node_standby_lag_records{"):
            labels, value = line.rsplit(" ", 1)
            lag[int(labels.split('partition="')[1].split('"')[0])] = float(value)
    return lag


async def test_a_standby_takes_over_a_killed_nodes_partitions_from_its_warm_copies(
    stack: Stack, tmp_path: Path
) -> None:
    node_a = stack.start_node("node-a", "--dispatch-timeout-s", "3")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    jobs = await stack.enqueue_effects(150, "before")
    await wait_for(
        lambda: _count(node_a, "partition_assigned", PARTITIONS), what="node-a to own all"
    )
    node_b = stack.start_node(
        "node-b", "--standby", "--dispatch-timeout-s", "3", "--metrics-port", str(METRICS_PORT)
    )
    settings, group = stack.settings, Topics(stack.namespace).node_group

    async def split() -> dict[int, str] | None:
        owners = await partition_owners(settings, group, stack.topics.events)
        members = {client.split("-node-")[-1] for client in owners.values()}
        return owners if len(owners) == PARTITIONS and len(members) == 2 else None

    owners = await wait_for(split, what="node-a and node-b to share the partitions")
    victims = {p for p, client in owners.items() if client.endswith("node-node-a")}
    assert victims, owners
    jobs += await stack.enqueue_effects(150, "shared")
    await wait_for(lambda: settled(stack, jobs), what="the jobs so far to finish")

    async def warm() -> bool:
        lag = await asyncio.to_thread(standby_lag)
        return all(p in lag and lag[p] <= MAX_TAIL for p in victims)

    await wait_for(warm, what="node-b's standby copies to be near the log's end")
    assert any(e["partition"] in victims for e in logged(node_b, "standby_partition_held"))

    node_a.kill()
    jobs += await stack.enqueue_effects(100, "after")

    async def taken_over() -> list[dict[str, object]] | None:
        lines = [e for e in logged(node_b, "standby_takeover") if e["partition"] in victims]
        return lines if {e["partition"] for e in lines} >= victims else None

    takeovers = await wait_for(taken_over, what="node-b to take over from its standby copies")
    print(f"take-overs from standby copies: {takeovers}")
    assert all(isinstance(e["tail_records"], int) for e in takeovers)
    assert max(int(str(e["tail_records"])) for e in takeovers) <= MAX_TAIL, takeovers
    for event in NO_RESTORE:
        assert not [e for e in logged(node_b, event) if e["partition"] in victims], event
    await wait_for(lambda: settled(stack, jobs), what="every job to finish on node-b")
    assert node_b.stop() == 0

    code, document = await stack.rebuild_verify("node-b", tmp_path / "rebuild")
    assert code == 0 and document["digest_match"] is True, document
    folded = await stack.check()
    successes = Counter(
        job_id
        for job_id, timeline in folded.job_timelines.items()
        for entry in timeline
        if entry.kind == "AttemptSucceeded" and entry.verdict is Verdict.APPLIED
    )
    assert set(successes.values()) == {1} and len(successes) == len(jobs)
    states = [await stack.job(j) for j in jobs]
    assert all(s is not None and s.status is Status.SUCCEEDED for s in states)


async def _count(proc: Proc, event: str, at_least: int) -> bool:
    return len(logged(proc, event)) >= at_least
