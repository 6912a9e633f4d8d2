"""Standby copies through the PartitionLog twin: folded below the group's offset only (a record
past it may owe an effect), equal to a full fold at the same offset, released (index closed)
before an owner opens it and held again after, skipped when unusable, and their lag and take-over
reported."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from evsched.adapters import avro
from evsched.adapters.index.store import IndexBatch, PartitionIndex
from evsched.adapters.kafka.topics import Topics
from evsched.core.events import JobEnqueued
from evsched.core.fold import FOLD_VERSION
from evsched.runtime.node import standby as standby_module
from evsched.runtime.node.standby import Standby, parse_partitions, unowned
from evsched.runtime.projection.changelog import META_KEY, Meta, encode_meta
from evsched.runtime.projection.projector import Projector
from evsched.runtime.projection.restore import index_path, open_index, restore
from evsched.testing import MemoryPartitionLog

DEADLINE_S = 20.0


def enqueue(job_id: str) -> bytes:
    return avro.encode_event(
        JobEnqueued(
            event_id=f"e-{job_id}", job_id=job_id, emitted_at=0, source="t", task="t",
            queue="q", args=b"[]",
        )
    )  # fmt: skip


def add_jobs(log: MemoryPartitionLog, partition: int, first: int, count: int) -> None:
    for i in range(first, first + count):
        log.append(partition, enqueue(f"p{partition}-j{i}"), key=f"j{i}".encode(), log_at=i)
        log.mark(partition)  # each produce is a transaction: its marker takes an offset


class Offsets:
    """The owner group's committed offsets, as a test sets them."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}
        self.closed = False

    async def committed(self) -> dict[int, int]:
        return dict(self.offsets)

    async def close(self) -> None:
        self.closed = True


class Recorder:
    """A logger that keeps every event it is given."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **kw: Any) -> None:
        self.events.append((event, kw))

    warning = error = info

    def named(self, event: str) -> list[dict[str, Any]]:
        return [kw for name, kw in self.events if name == event]


async def until(condition: Callable[[], bool], what: str) -> None:
    async with asyncio.timeout(DEADLINE_S):
        while not condition():
            await asyncio.sleep(0.02)
    assert condition(), what


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(standby_module, "REFRESH_S", 0.02)
    monkeypatch.setattr(standby_module, "READ_WAIT_S", 0.02)


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[MemoryPartitionLog, Offsets, Standby]]:
    log = MemoryPartitionLog(topic=Topics("ns").events, partitions=2)
    offsets = Offsets()
    registry = CollectorRegistry()
    gauge = Gauge("lag", "lag", ["partition"], registry=registry)
    standby = Standby(log, offsets, tmp_path, lag_gauge=gauge, logger=Recorder())
    await standby.start()
    try:
        yield log, offsets, standby
    finally:
        await standby.stop()


def applied(standby: Standby, partition: int) -> int:
    return standby.projectors[partition].index.applied_offset()


async def test_folds_only_below_the_groups_offset_and_equals_a_full_fold(
    setup: tuple[MemoryPartitionLog, Offsets, Standby], tmp_path: Path
) -> None:
    log, offsets, standby = setup
    add_jobs(log, 0, 0, 10)  # offsets 0..19, a record then a marker
    offsets.offsets[0] = 8  # the owner committed the first four jobs
    await standby.hold([0])
    await until(lambda: applied(standby, 0) == 6, "the standby folded up to the group's offset")
    await until(lambda: standby.lag.get(0) == 20 - 7, "the lag is what the index misses")
    index = standby.projectors[0].index
    assert index.job("p0-j3") is not None and index.job("p0-j4") is None
    offsets.offsets[0] = 20
    await until(lambda: applied(standby, 0) == 18, "the standby follows the group's offset")
    assert index.job("p0-j9") is not None
    # The same log folded in one go, to the same offset: the same index.
    full = Projector(PartitionIndex(tmp_path / "full", 0))
    await restore(log, {0: full})
    assert full.index.applied_offset() == 18
    assert full.index.digest() == index.digest()
    full.index.close()


async def test_release_closes_the_index_for_the_owner_and_hold_follows_it_again(
    setup: tuple[MemoryPartitionLog, Offsets, Standby], tmp_path: Path
) -> None:
    log, offsets, standby = setup
    add_jobs(log, 1, 0, 5)
    offsets.offsets[1] = 10
    await standby.hold([1])
    await until(lambda: applied(standby, 1) == 8, "the standby caught up")
    await standby.release([1])
    assert 1 not in standby.projectors and standby.taken == {1: 9}
    # The owner opens the same index (its RocksDB lock is free) and folds the tail itself.
    owner = open_index(tmp_path, 1)
    assert owner.applied_offset() == 8
    add_jobs(log, 1, 5, 3)
    offsets.offsets[1] = 16
    standby.took_over(1, resume_offset=9, end_offset=16)
    [takeover] = standby.log.named("standby_takeover")
    assert takeover == {"partition": 1, "resume_offset": 9, "end_offset": 16, "tail_records": 7}
    owner.close()
    # Revoked: held again, from where the owner left the index.
    await standby.hold([1])
    await until(lambda: applied(standby, 1) == 14, "the standby follows again")
    assert standby.taken == {}


async def test_a_copy_restored_on_open_is_reported_unused(
    setup: tuple[MemoryPartitionLog, Offsets, Standby],
) -> None:
    _log, _offsets, standby = setup
    await standby.hold([0])
    await standby.release([0])
    standby.took_over(0, resume_offset=500, end_offset=510)
    assert standby.log.named("standby_takeover") == []
    assert standby.log.named("standby_copy_unused") == [
        {"partition": 0, "held_to": 0, "resume": 500}
    ]
    standby.took_over(0, resume_offset=0, end_offset=5)  # told once only
    assert standby.log.named("standby_takeover") == []


async def test_unusable_indexes_are_skipped_not_folded(
    setup: tuple[MemoryPartitionLog, Offsets, Standby], tmp_path: Path
) -> None:
    log, _offsets, standby = setup
    add_jobs(log, 0, 0, 3)
    log.trim(0, 4)  # the log lost its start: an empty index would skip jobs
    other = PartitionIndex(index_path(tmp_path, 1), 1)
    other.write(IndexBatch(), 3, FOLD_VERSION + 1)  # built by another fold version
    other.close()
    await standby.hold([0, 1])
    assert standby.projectors == {}
    trimmed, foreign = standby.log.named("standby_partition_skipped")
    assert trimmed["partition"] == 0 and "log starts at 4" in trimmed["reason"]
    assert foreign["partition"] == 1 and f"fold version {FOLD_VERSION + 1}" in foreign["reason"]


async def test_an_index_still_open_elsewhere_is_skipped(
    setup: tuple[MemoryPartitionLog, Offsets, Standby], tmp_path: Path
) -> None:
    _, _, standby = setup
    owner = open_index(tmp_path, 1)  # an owner still holds it: never two writers
    try:
        await standby.hold([1])
    finally:
        owner.close()
    assert 1 not in standby.projectors
    assert standby.log.named("standby_partition_skipped")[0]["partition"] == 1


async def test_stop_releases_everything_and_closes_its_readers(
    setup: tuple[MemoryPartitionLog, Offsets, Standby], tmp_path: Path
) -> None:
    log, offsets, standby = setup
    await standby.hold([0, 1])
    assert sorted(standby.projectors) == [0, 1]
    await standby.stop()
    assert standby.projectors == {} and offsets.closed and not log.started
    await standby.hold([0])  # a late revoke during shutdown holds nothing
    assert standby.projectors == {}
    open_index(tmp_path, 0).close()


def test_unowned_is_every_partition_not_excluded() -> None:
    assert unowned(4, {1, 3}) == [0, 2]


async def test_a_failed_fold_or_read_waits_then_folds_again_from_the_index(
    setup: tuple[MemoryPartitionLog, Offsets, Standby], monkeypatch: pytest.MonkeyPatch
) -> None:
    log, offsets, standby = setup
    monkeypatch.setattr(standby_module, "RETRY_S", 0.05)
    add_jobs(log, 0, 0, 4)
    offsets.offsets[0] = 8
    await standby.hold([0])
    projector = standby.projectors[0]
    real_fold = projector.fold
    calls = 0

    def failing_once(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("a bug in the fold")
        return real_fold(*args, **kw)

    monkeypatch.setattr(projector, "fold", failing_once)
    log.fail_next = True  # and the broker fails once too
    await until(lambda: applied(standby, 0) == 6, "the standby folded after the failures")
    assert calls >= 2
    names = [name for name, _ in standby.log.events]
    assert "standby_fold_failed" in names and "standby_read_failed" in names


async def test_only_the_chosen_partitions_are_held(tmp_path: Path) -> None:
    log = MemoryPartitionLog(topic=Topics("ns").events, partitions=3)
    standby = Standby(log, Offsets(), tmp_path, logger=Recorder(), only={0, 2})
    await standby.start()
    try:
        await standby.hold([0, 1, 2])
        assert sorted(standby.projectors) == [0, 2]
    finally:
        await standby.stop()


def test_standby_partitions_parse_lists_and_ranges_and_say_what_is_wrong() -> None:
    assert parse_partitions("0, 2,5-7,") == {0, 2, 5, 6, 7}
    for text, says in [
        ("a", "'a' is not a partition number"),
        ("3-1", "'3-1' ends before it starts"),
        ("-1", "'-1' is not a partition number"),
        (",", "no partition given"),
    ]:
        with pytest.raises(ValueError, match=says):
            parse_partitions(text)


def test_the_node_command_takes_standby_partitions(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from evsched.cli import app
    from evsched.cli import node as cli

    seen: list[Any] = []

    async def serve(config: Any) -> None:
        seen.append(config)

    monkeypatch.setattr(cli, "serve_node", serve)
    monkeypatch.setattr(cli, "configure_logging", lambda **kw: None)  # not the runner's stderr
    runner = CliRunner(env={"EVSCHED_INSECURE_UNSIGNED_DISPATCH": "1"})
    result = runner.invoke(app, ["node", "--standby", "--standby-partitions", "1,3-4"])
    assert result.exit_code == 0, result.output
    assert seen[0].standby and seen[0].standby_partitions == {1, 3, 4}
    result = runner.invoke(app, ["node", "--standby", "--standby-partitions", "x"])
    assert result.exit_code == 2 and "--standby-partitions: 'x' is not" in result.output
    result = runner.invoke(app, ["node", "--standby-partitions", "1"])
    assert result.exit_code == 2 and "needs --standby" in result.output


async def test_a_copy_folds_no_further_than_its_changelogs_snapshot(tmp_path: Path) -> None:
    """An owner writes its changelog on from the index it opens: a copy ahead of the snapshot
    would hold changes the changelog lacks, so it waits for the owner's next flush."""
    log = MemoryPartitionLog(topic=Topics("ns").events, partitions=1)
    state = MemoryPartitionLog(topic=Topics("ns").state, partitions=1)
    offsets = Offsets()
    standby = Standby(log, offsets, tmp_path, logger=Recorder(), open_state=lambda _: state)
    await standby.start()
    try:
        add_jobs(log, 0, 0, 10)
        offsets.offsets[0] = 20  # the owner committed every job
        flush = Meta(10, FOLD_VERSION)  # and flushed its changelog as of offset 10
        state.append(0, encode_meta(flush), key=META_KEY, log_at=0)
        await standby.hold([0])
        await until(lambda: standby.bounds.get(0) == 11, "bounded by the snapshot")
        await until(lambda: applied(standby, 0) == 10, "folded up to the snapshot")
        assert standby.projectors[0].next_offset == 11
        state.append(0, encode_meta(Meta(14, FOLD_VERSION)), key=META_KEY, log_at=1)
        await until(lambda: applied(standby, 0) == 14, "the next flush lets it on")
        older = Meta(15, FOLD_VERSION, format=1)  # an owner seeds that format anew: no bound
        state.append(0, encode_meta(older), key=META_KEY, log_at=2)
        await until(lambda: applied(standby, 0) == 18, "up to the group's offset")
    finally:
        await standby.stop()
