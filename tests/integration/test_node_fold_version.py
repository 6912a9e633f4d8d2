"""A fold-version bump on a real node and broker: indexes (and a changelog) another fold version
wrote are rebuilt from the log when their partitions open (logged, counted) and written to the
changelog, jobs keep running, and the rebuilt indexes equal what ``evsched rebuild`` makes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaProducer
from tests.conftest import unique_name
from tests.integration.engine import Stack, logged, wait_for
from tests.prometheus import parse, value

from evsched.adapters.index.store import IndexBatch, PartitionIndex
from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import TERMINAL_STATUSES, Status
from evsched.devstack.process import free_port
from evsched.runtime.projection.changelog import ChangelogWriter, Meta

pytestmark = pytest.mark.broker

REWRITTEN = (0, 2)  # partitions whose index another fold version "wrote"; p1 stays as it is


@pytest.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("foldv")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path)
    try:
        yield engine
    finally:
        await engine.close()


def all_succeeded(stack: Stack, job_ids: list[str]) -> object:
    async def probe() -> bool:
        for job_id in job_ids:
            state = await stack.job(job_id)
            if state is None or state.status not in TERMINAL_STATUSES:
                return False
            assert state.status is Status.SUCCEEDED, state
        return True

    return probe


async def _foreign_changelog(stack: Stack, applied: dict[int, int]) -> None:
    """Meta records of another fold version on the partitions' changelog, as it would leave."""
    producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap)
    await producer.start()
    try:
        for partition, offset in applied.items():
            meta = ChangelogWriter(stack.topics.state, partition).meta(
                Meta(offset, FOLD_VERSION + 1)
            )
            await producer.send_and_wait(meta.topic, meta.value, key=meta.key, partition=partition)
    finally:
        await producer.stop()


async def rebuilds_counted(port: int) -> float:
    try:
        async with httpx.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=10)).text
    except httpx.ConnectError:
        return 0.0  # not serving yet
    return value(parse(text), "evsched_node_index_rebuilds_total", reason="fold_version")


async def test_a_node_rebuilds_indexes_of_another_fold_version_and_runs_on(
    stack: Stack, tmp_path: Path
) -> None:
    node = stack.start_node("node-1", "--dispatch-timeout-s", "3")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    before = await stack.enqueue_effects(60, "before")
    await wait_for(all_succeeded(stack, before), what="the first jobs to finish")
    assert node.stop() == 0

    data = stack.node_data("node-1")
    applied = {}
    for partition in REWRITTEN:
        index = PartitionIndex(data / f"p{partition:04d}", partition)
        applied[partition] = index.applied_offset()
        assert applied[partition] >= 0 and index.fold_version() == FOLD_VERSION
        index.write(IndexBatch(), applied[partition], FOLD_VERSION + 1)  # the marker alone
        index.close()
    # ... and its changelog (a snapshot of this fold version would be restored instead).
    await _foreign_changelog(stack, {p: applied[p] for p in REWRITTEN})

    port = free_port()
    restarted = stack.start_node("node-1", "--dispatch-timeout-s", "3", "--metrics-port", str(port))
    await wait_for(lambda: rebuilds_counted(port), what="the rebuilds to be counted", timeout_s=90)
    after = await stack.enqueue_effects(60, "after")
    await wait_for(all_succeeded(stack, before + after), what="every job to finish", timeout_s=90)

    rebuilt = {int(str(e["partition"])): e for e in logged(restarted, "partition_index_rebuilt")}
    assert sorted(rebuilt) == list(REWRITTEN)
    for partition, entry in rebuilt.items():
        assert (entry["old_version"], entry["new_version"]) == (FOLD_VERSION + 1, FOLD_VERSION)
        assert int(str(entry["records"])) > 0 and float(str(entry["seconds"])) >= 0
        # Up to the group's offset, which the old index had reached (or passed, by records that
        # sent nothing): never beyond what the old index held.
        assert int(str(entry["applied_offset"])) <= applied[partition]
    assert await rebuilds_counted(port) == len(REWRITTEN)
    seeded = {int(str(e["partition"])) for e in logged(restarted, "partition_changelog_seeded")}
    assert seeded == set(REWRITTEN)  # the rebuilt indexes are written to the changelog
    assert not logged(restarted, "partition_open_failed")
    async with httpx.AsyncClient() as http:
        ready = await http.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
    assert ready.status_code == 200 and "p0 running" in ready.text, ready.text
    assert restarted.stop() == 0

    # The rebuilt indexes (and the one left alone) equal a fresh `evsched rebuild` of the log.
    code, document = await stack.rebuild_verify("node-1", tmp_path / "rebuild")
    assert code == 0 and document["digest_match"] is True, document
    await stack.check()
