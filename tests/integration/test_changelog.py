"""The state changelog on the real broker and real node processes: a restore from ``<ns>.state``
equals a full fold at the same offset (digest); a take-over after the owner's data dir was deleted
and the log trimmed restores from the changelog and loses nothing; a node without a snapshot on
a trimmed log refuses the partition loudly; ``rebuild --verify`` on a trimmed log says how."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, all_succeeded, logged, wait_for

from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.fold import FOLD_VERSION
from evsched.core.state import Status
from evsched.operator.replica_dir import catch_up
from evsched.runtime.projection.changelog import latest_meta
from evsched.runtime.projection.changelog_restore import restore_partition
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import restore
from evsched.runtime.replica import Replica

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(900)]
# Node and worker processes start slowly on a loaded machine: generous deadlines.
DEADLINE_S = 240.0

PARTITIONS = 2


async def _stack(bootstrap: str, tmp_path: Path, name: str) -> Stack:
    namespace = unique_name(name)
    await ensure_topics(bootstrap, namespace, event_partitions=PARTITIONS, queues=["default"])
    return Stack(bootstrap, namespace, tmp_path, partitions=PARTITIONS)


async def _every_partition(proc: Proc, event: str) -> list[dict[str, Any]] | None:
    found = logged(proc, event)
    return found if {e["partition"] for e in found} == set(range(PARTITIONS)) else None


async def _committed(stack: Stack) -> dict[int, int]:
    """The nodes group's offsets, once it has committed one on every partition.

    A node commits its offset in the transaction of the effects it sent for the records below
    it, so it may not have yet when the jobs are seen succeeded: trimming then would cut nothing.
    """

    async def everywhere() -> dict[int, int] | None:
        found = {p: await stack.node_committed(p) for p in range(PARTITIONS)}
        if all(offset for offset in found.values()):
            return {p: offset or 0 for p, offset in found.items()}
        await asyncio.sleep(0.5)
        return None

    return await wait_for(
        everywhere, what="the node's offsets on every partition", timeout_s=DEADLINE_S
    )


async def _snapshot_covers(stack: Stack, committed: dict[int, int]) -> dict[int, int]:
    """Wait until the changelog's newest snapshot of every partition covers the group's offset
    there (``committed``), which may then be trimmed: returns it.

    A node flushes its changelog once per interval, so the snapshot lags the offsets it commits
    by up to an interval; and a node killed before its flush leaves none: ask while it lives.
    """

    async def snapshots() -> dict[int, int] | None:
        for partition, offset in committed.items():
            async with KafkaPartitionLog(
                stack.settings, stack.topics.state, [partition], client_id="t-covers"
            ) as state:
                meta = await latest_meta(state, partition)
            if meta is None or meta.applied_offset + 1 < offset:  # the flush is an interval away
                await asyncio.sleep(0.5)
                return None
        return committed

    return await wait_for(
        snapshots, what="a snapshot of every partition at its offset", timeout_s=DEADLINE_S
    )


async def _work(stack: Stack, count: int) -> list[str]:
    """Jobs that succeed with an effect each."""
    return await stack.enqueue_effects(count, "cl")


async def test_a_restore_from_the_changelog_equals_a_full_fold_at_its_offset(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    stack = await _stack(kafka_bootstrap, tmp_path, "clrestore")
    try:
        node = stack.start_node("node-1")
        stack.start_worker("worker-1")
        ids = await _work(stack, 40)
        await wait_for(
            lambda: all_succeeded(stack, ids), what="the jobs to succeed", timeout_s=DEADLINE_S
        )
        assert node.stop() == 0
        for partition in range(PARTITIONS):
            async with KafkaPartitionLog(
                stack.settings, stack.topics.state, [partition], client_id="t-restore"
            ) as state:
                meta = await latest_meta(state, partition)
                assert meta is not None and meta.fold_version == FOLD_VERSION
                restored = await restore_partition(
                    state, tmp_path / "restored", partition, log_start=0
                )
            assert restored == meta
            folded = PartitionIndex(tmp_path / "folded" / f"p{partition:04d}", partition)
            async with KafkaPartitionLog(
                stack.settings, stack.topics.events, [partition], client_id="t-fold"
            ) as events:
                await restore(
                    events,
                    {partition: Projector(folded, keyring=stack.keyring)},
                    {partition: meta.applied_offset + 1},
                )
            index = PartitionIndex(tmp_path / "restored" / f"p{partition:04d}", partition)
            live = PartitionIndex(stack.node_data("node-1") / f"p{partition:04d}", partition)
            try:
                assert index.applied_offset() == folded.applied_offset() == meta.applied_offset
                assert index.digest() == folded.digest()
                assert live.applied_offset() == meta.applied_offset  # a clean stop: all sent
                assert live.digest() == index.digest()
            finally:
                index.close()
                folded.close()
                live.close()
    finally:
        await stack.close()


async def test_a_takeover_after_the_owners_data_dir_was_deleted_and_the_log_trimmed_restores(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    stack = await _stack(kafka_bootstrap, tmp_path, "cltakeover")
    try:
        node_a = stack.start_node("node-a")
        stack.start_worker("worker-1")
        await stack.replica()  # a reader that keeps its own index, as the API does
        before = await _work(stack, 30)
        async with stack.app() as app:
            later = await app.get_task("s.effect").options(delay=8.0).enqueue("later")
        await wait_for(
            lambda: all_succeeded(stack, before),
            what="the first jobs to succeed",
            timeout_s=DEADLINE_S,
        )
        # Asked before the kill: a replica may see the jobs succeed before the node has folded
        # the successes and committed its offsets, and a dead node commits nothing (ci17 waited
        # here past the test's timeout). It may commit more before the kill: that is kept.
        # Its changelog is flushed once per interval: a kill before the first flush would leave
        # none (the jobs may all succeed within it), and then nothing may be trimmed.
        covered = await _snapshot_covers(stack, await _committed(stack))
        node_a.kill()
        shutil.rmtree(stack.node_data("node-a"))
        # Everything the group committed and the changelog holds may go.
        await stack.trim(covered)
        node_b = stack.start_node("node-b")
        restored = await wait_for(
            lambda: _every_partition(node_b, "partition_index_restored"),
            what="node-b to restore from the changelog",
            timeout_s=DEADLINE_S,
        )
        assert {e["partition"] for e in restored} == set(range(PARTITIONS))
        after = await _work(stack, 20)
        await wait_for(
            lambda: all_succeeded(stack, [*before, *after, later]),
            what="every job, the delayed one enqueued before the trim too",
            timeout_s=DEADLINE_S,
        )
        assert not logged(node_b, "partition_index_rebuild_refused")
    finally:
        await stack.close()


async def test_a_trimmed_log_without_a_snapshot_is_refused_loudly(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    stack = await _stack(kafka_bootstrap, tmp_path, "clrefuse")
    try:
        async with stack.app() as app:
            task = app.get_task("s.effect")
            # no node: no changelog. Job ids hash to partitions: 40 put at least 3 records
            # on each of the two (10 left one with fewer once in ~9 runs: nothing to trim)
            for i in range(40):
                await task.enqueue(f"written-by-no-node-{i}")
        await stack.trim({p: 3 for p in range(PARTITIONS)})
        node = stack.start_node("node-1")
        refused = await wait_for(
            lambda: asyncio.to_thread(logged, node, "partition_index_rebuild_refused"),
            what="the node to refuse its partitions",
            timeout_s=DEADLINE_S,
        )
        first = refused[0]
        assert first["level"] == "error"
        assert "starts at offset 3" in first["reason"] and "no snapshot" in first["reason"]
        assert "archive" in first["fix"]
        assert not logged(node, "partition_assigned")  # nothing started from the log's start
    finally:
        await stack.close()


async def test_rebuild_verify_and_new_replicas_on_a_trimmed_log_use_the_changelog(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    stack = await _stack(kafka_bootstrap, tmp_path, "clverify")
    try:
        node = stack.start_node("node-1")
        stack.start_worker("worker-1")
        ids = await _work(stack, 20)
        await wait_for(
            lambda: all_succeeded(stack, ids), what="the jobs to succeed", timeout_s=DEADLINE_S
        )
        await stack.trim(await _snapshot_covers(stack, await _committed(stack)))
        more = await _work(stack, 10)
        await wait_for(
            lambda: all_succeeded(stack, more),
            what="the later jobs to succeed",
            timeout_s=DEADLINE_S,
        )
        assert node.stop() == 0
        code, document = await stack.rebuild_verify("node-1", tmp_path / "rebuilt")
        assert code == 0, document
        assert document["digest_match"] is True
        sources = {p["partition"]: p["source"] for p in document["partitions"]}
        assert set(sources.values()) == {"changelog+log"}, sources
        # A new API replica and a new operator's replica restore from the changelog too.
        replica = Replica(stack.settings, tmp_path / "new-replica")
        await replica.start()
        try:
            await wait_for(
                lambda: all_succeeded(replica, [*ids, *more]),
                what="the new replica to hold every job",
                timeout_s=DEADLINE_S,
            )
            assert replica.failing == {}
        finally:
            await replica.stop()
        local = await catch_up(stack.settings, tmp_path / "operator")
        try:
            for job_id in [*ids, *more]:
                state = local.index_of(job_id).job(job_id)
                assert state is not None and state.status is Status.SUCCEEDED
        finally:
            local.close()
    finally:
        await stack.close()
