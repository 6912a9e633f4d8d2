"""A flood of garbage and of refused events on the real broker (fold version 7): the node's index,
a read replica's (the API's) and a restore from the ``<ns>.state`` changelog each hold exactly the
newest ``POISON_KEPT`` undecodable records and refused events of the partition, the tallies count
every one, and ``rebuild --verify`` equals the node's index."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio
from tests.integration.engine import Proc, Stack, all_succeeded, node_and_worker, wait_for

from evsched.adapters import avro
from evsched.adapters.index.keys import REFUSED, U64, UNDECODABLE
from evsched.adapters.index.poison import POISON_KEPT
from evsched.adapters.index.readonly import ReadOnlyIndex
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.partition_log import KafkaPartitionLog
from evsched.core import tallies
from evsched.core.events import JobEnqueued
from evsched.runtime.projection.changelog_restore import restore_partition

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(900)]

# Processes start slowly on a loaded machine: generous, since every wait is on a condition.
DEADLINE_S = 600.0
PARTITION = 1
EXTRA = 25  # records past the bound, of each kind
_FORGED = JobEnqueued(
    event_id="forged", job_id="", emitted_at=0, source="forger", task="s.noop", queue="default",
    args=b"{}",
)  # fmt: skip


def flood(count: int, *, first: int = 0, huge: bool = True) -> list[tuple[str, bytes]]:
    """``count`` garbage records and ``count`` refused events (family, value), interleaved,
    numbered from ``first``.

    The refused ones have an empty job id; with ``huge``, the first two and the last have a
    70 kB one (as ``hardening`` forges it): the first two are trimmed, the last is kept.
    """
    out: list[tuple[str, bytes]] = []
    for n in range(first, first + count):
        big = huge and (n - first < 2 or n == first + count - 1)
        event = replace(_FORGED, event_id=f"forged-{n}", job_id="j" * 70_000 if big else "")
        out += [(UNDECODABLE, b"\x00garbage-%d" % n), (REFUSED, avro.encode_event(event))]
    return out


async def produce_to(stack: Stack, partition: int, values: list[bytes]) -> list[int]:
    """Write ``values`` to one events partition as a foreign producer would; their offsets."""
    producer = kafka.producer(stack.settings, client_id="poison-test")
    await producer.start()
    try:
        sent = [
            await producer.send(stack.topics.events, value, key=b"poison", partition=partition)
            for value in values
        ]
        return [(await future).offset for future in sent]
    finally:
        await producer.stop()


@pytest_asyncio.fixture
async def engine(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[tuple[Stack, Proc]]:
    async with node_and_worker(kafka_bootstrap, tmp_path, "poison") as running:
        yield running


def kept(index: PartitionIndex, family: str) -> list[int]:
    return [int(U64.unpack(key)[0]) for key, _ in index.scan(family)]


def check_index(index: PartitionIndex, newest: dict[str, list[int]], what: str) -> None:
    for family, offsets in newest.items():
        assert kept(index, family) == offsets, f"{what}: {family}"
    assert index.tallies()[tallies.UNDECODABLE] == POISON_KEPT + EXTRA, what


async def test_a_flood_of_poison_leaves_the_newest_in_every_index_and_the_changelog(
    engine: tuple[Stack, Proc], tmp_path: Path
) -> None:
    stack, node = engine
    replica = await stack.replica()  # a reader with its own index, as the API has
    records = flood(POISON_KEPT + EXTRA)
    offsets = await produce_to(stack, PARTITION, [value for _, value in records])
    newest = {
        family: [o for o, (f, _) in zip(offsets, records, strict=True) if f == family][
            -POISON_KEPT:
        ]
        for family in (UNDECODABLE, REFUSED)
    }
    assert newest[REFUSED][-1] == offsets[-1]  # the last 70 kB one is kept
    jobs = await stack.enqueue_effects(6, "after-the-flood")  # the partition folds on as ever
    await wait_for(lambda: all_succeeded(stack, jobs), what="the jobs", timeout_s=DEADLINE_S)

    await replica.wait_for(PARTITION, offsets[-1], timeout_s=DEADLINE_S)
    check_index(replica.index(PARTITION), newest, "the replica")
    await stack.wait_node_past(PARTITION, offsets[-1])
    assert node.stop() == 0
    live_dir = stack.node_data("node-1") / f"p{PARTITION:04d}"
    live = ReadOnlyIndex(live_dir, PARTITION)
    try:
        check_index(live, newest, "the node")
        live_digest, live_offset = live.digest(), live.applied_offset()
    finally:
        live.close()

    async with KafkaPartitionLog(
        stack.settings, stack.topics.state, [PARTITION], client_id="t-poison-restore"
    ) as state:
        meta = await restore_partition(state, tmp_path / "restored", PARTITION, log_start=0)
    assert meta is not None and meta.applied_offset == live_offset  # a clean stop: all sent
    restored = PartitionIndex(tmp_path / "restored" / f"p{PARTITION:04d}", PARTITION)
    try:
        check_index(restored, newest, "the changelog's restore")
        assert restored.digest() == live_digest
    finally:
        restored.close()

    code, document = await stack.rebuild_verify("node-1", tmp_path / "rebuilt")
    assert code == 0 and document["digest_match"] is True, document
    await stack.check(all_terminal=True)
