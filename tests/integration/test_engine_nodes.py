"""Nodes under crashes and rebalances, with real processes: nothing lost, nothing committed twice,
the index equal to a rebuild from the log, cron slots fired exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, wait_for

from evsched.adapters import avro
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.events import JobEnqueued, ScheduleFired
from evsched.core.state import TERMINAL_STATUSES, Status, Verdict

pytestmark = pytest.mark.broker


@pytest.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("nodes")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path)
    try:
        yield engine
    finally:
        await engine.close()


async def all_terminal(stack: Stack, job_ids: list[str]) -> bool:
    for job_id in job_ids:
        state = await stack.job(job_id)
        if state is None or state.status not in TERMINAL_STATUSES:
            return False
    return True


async def succeeded_count(stack: Stack, job_ids: list[str]) -> int:
    states = [await stack.job(j) for j in job_ids]
    return sum(1 for s in states if s is not None and s.status is Status.SUCCEEDED)


def succeeded_at_least(
    stack: Stack, job_ids: list[str], minimum: int
) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return await succeeded_count(stack, job_ids) >= minimum

    return probe


async def test_node_sigkill_and_restart_loses_nothing_and_matches_a_rebuild(
    stack: Stack, tmp_path: Path
) -> None:
    node = stack.start_node("node-1", "--dispatch-timeout-s", "3")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    jobs = await stack.enqueue_effects(150, "crash")
    await wait_for(succeeded_at_least(stack, jobs, 20), what="some jobs to finish")
    node.kill()
    more = await stack.enqueue_effects(50, "while-down")  # acknowledged while no node runs
    restarted = stack.start_node("node-1", "--dispatch-timeout-s", "3")
    await wait_for(lambda: all_terminal(stack, jobs + more), what="every job to finish")
    assert await succeeded_count(stack, jobs + more) == 200
    # The workers' successes are in the log before the node folds them: its effects, once it has.
    await stack.check()
    assert restarted.stop() == 0

    # I4: each partition's live index equals a fresh fold of the log up to the same offset, as
    # `evsched rebuild --verify` makes and compares it.
    applied = {}
    for partition in range(stack.partitions):
        live = PartitionIndex(stack.node_data("node-1") / f"p{partition:04d}", partition)
        applied[partition] = live.applied_offset()
        live.close()
    code, document = await stack.rebuild_verify("node-1", tmp_path / "rebuild")
    assert code == 0 and document["digest_match"] is True, document
    rows = {row["partition"]: row for row in document["partitions"]}
    for partition, offset in applied.items():
        assert rows[partition]["compared"] and rows[partition]["problem"] is None
        assert rows[partition]["applied_offset"] == offset == rows[partition]["live_applied_offset"]
    await stack.check()


async def test_two_nodes_and_rebalances_mid_load_never_commit_twice(stack: Stack) -> None:
    first = stack.start_node("node-1", "--dispatch-timeout-s", "3")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    jobs = await stack.enqueue_effects(120, "a")
    second = stack.start_node("node-2", "--dispatch-timeout-s", "3")
    await wait_for(lambda: _logged(second, "partition_assigned"), what="node-2 to own partitions")
    jobs += await stack.enqueue_effects(120, "b")
    await wait_for(succeeded_at_least(stack, jobs, 150), what="most jobs to finish")
    first.stop()  # rebalance again: node-2 takes everything
    jobs += await stack.enqueue_effects(60, "c")
    await wait_for(lambda: all_terminal(stack, jobs), what="every job to finish")
    assert await succeeded_count(stack, jobs) == len(jobs)
    folded = await stack.check()
    successes = Counter(
        job_id
        for job_id, timeline in folded.job_timelines.items()
        for entry in timeline
        if entry.kind == "AttemptSucceeded" and entry.verdict is Verdict.APPLIED
    )
    assert set(successes.values()) == {1}


async def _logged(proc: Proc, event: str) -> bool:
    return f'"event": "{event}"' in proc.log()


async def test_cron_with_two_nodes_fires_each_slot_exactly_once(stack: Stack) -> None:
    first = stack.start_node("node-1")
    second = stack.start_node("node-2")
    stack.start_worker("worker-1", "--lease-s", "3")
    for node in (first, second):
        await wait_for(lambda n=node: _logged(n, "partition_assigned"), what=f"{node.name} to join")
    async with stack.app() as app:
        await app.upsert_schedule("every-2s", "* * * * * */2", "UTC", "s.noop")

    async def fired(minimum: int) -> list[ScheduleFired] | None:
        events, _ = await stack.history()
        applied = [e for e, _ in events if isinstance(e, ScheduleFired)]
        return applied if len({e.fire_at for e in applied}) >= minimum else None

    await wait_for(lambda: fired(2), what="two slots to fire", timeout_s=30)
    second.kill()  # the schedule's owner may change mid-way
    await wait_for(lambda: fired(5), what="five slots to fire", timeout_s=40)
    async with stack.app() as app:
        await app.delete_schedule("every-2s")

    replica = await stack.replica()

    async def deleted() -> bool:
        return any(e.kind == "ScheduleDeleted" for e in replica.timeline("every-2s"))

    await wait_for(deleted, what="the schedule's deletion to be folded")
    events, _ = await stack.history()
    cron_jobs = [e for e, _ in events if isinstance(e, JobEnqueued) and e.schedule_id]
    # Two nodes may both propose a slot; the id derived from the slot makes them one job.
    assert len({e.job_id for e in cron_jobs}) == len({e.fire_at for e in cron_jobs})
    applied_fires = Counter(
        entry.offset
        for entry in replica.timeline("every-2s")
        if entry.kind == "ScheduleFired" and entry.verdict is Verdict.APPLIED
    )
    slots = {e.fire_at for e, _ in events if isinstance(e, ScheduleFired)}
    assert len(applied_fires) == len(slots) >= 5
    fired_jobs = sorted({e.job_id for e in cron_jobs})
    await wait_for(lambda: all_terminal(stack, fired_jobs), what="every fired job to finish")
    await stack.check()


async def test_a_frozen_node_comes_back_as_a_zombie_and_commits_nothing_twice(
    stack: Stack,
) -> None:
    zombie = stack.start_node("node-1", "--dispatch-timeout-s", "5")
    await wait_for(lambda: _logged(zombie, "partition_assigned"), what="node-1 to own partitions")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    jobs = await stack.enqueue_effects(100, "before")
    zombie.signal(signal.SIGSTOP)  # frozen mid-load, past the group's session timeout
    heir = stack.start_node("node-2", "--dispatch-timeout-s", "5")
    await wait_for(lambda: _logged(heir, "partition_assigned"), what="node-2 to take over")
    jobs += await stack.enqueue_effects(100, "during")
    zombie.signal(signal.SIGCONT)  # its open transactions are fenced; then it rejoins
    jobs += await stack.enqueue_effects(100, "after")
    await wait_for(lambda: all_terminal(stack, jobs), what="every job to finish")
    assert await succeeded_count(stack, jobs) == len(jobs)
    assert zombie.popen.poll() is None and heir.popen.poll() is None  # both lived through it
    await stack.check()


# --- a frozen node's open transaction (exactly-once v2, KIP-447) ------------------------------
# The node is caught with a transaction open: frozen (SIGSTOP), it stays frozen only if an events
# partition's last stable offset lags its high watermark and an effects partition's too;
# otherwise it is thawed at once and caught again. Frozen past its session, its partitions go to
# an heir; thawed, it finds its generation gone.

# Freezes tried before the node is caught with a transaction open (each lasts a few ms).
CATCH_TRIES = 200


def _consumer(stack: Stack, isolation: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": stack.settings.bootstrap,
            "group.id": f"probe-{isolation}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )


def _ends(consumer: Consumer, topic: str, partitions: int) -> dict[int, int]:
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)[1]
        for p in range(partitions)
    }


def _read(consumer: Consumer, topic: str, partition: int, start: int, end: int) -> dict[int, bytes]:
    """The records of [start, end) a consumer of its isolation level returns, by offset."""
    consumer.assign([TopicPartition(topic, partition, start)])
    found: dict[int, bytes] = {}
    idle = 0
    while idle < 5:
        batch = consumer.consume(500, 0.5)
        if not batch:
            idle += 1
            continue
        for msg in batch:
            if msg.error() is None and start <= (msg.offset() or 0) < end:
                found[msg.offset() or 0] = msg.value() or b""
        if max((m.offset() or 0) for m in batch) >= end - 1:
            break
    consumer.unassign()
    return found


@contextlib.contextmanager
def _probes(stack: Stack) -> Iterator[tuple[Consumer, Consumer]]:
    committed, uncommitted = (
        _consumer(stack, "read_committed"),
        _consumer(stack, "read_uncommitted"),
    )
    try:
        yield committed, uncommitted
    finally:
        committed.close()
        uncommitted.close()


@contextlib.asynccontextmanager
async def _load(stack: Stack) -> AsyncIterator[list[str]]:
    """Jobs with effects enqueued without a pause: the node is in a transaction most of the time."""
    jobs: list[str] = []
    stop = asyncio.Event()

    async def feed() -> None:
        async with stack.app() as app:
            task = app.get_task("s.effect")
            while not stop.is_set():
                jobs.append(await task.enqueue(f"load-{len(jobs)}"))

    feeding = asyncio.create_task(feed())
    try:
        yield jobs
    finally:
        stop.set()
        await feeding


def _gaps(
    committed: Consumer, uncommitted: Consumer, topic: str, partitions: int
) -> dict[int, tuple[int, int]]:
    """Partitions whose last stable offset lags the high watermark: [lso, hw)."""
    stable, high = _ends(committed, topic, partitions), _ends(uncommitted, topic, partitions)
    return {p: (stable[p], high[p]) for p in range(partitions) if stable[p] < high[p]}


def _nodes_decisions(records: dict[int, bytes], source: str) -> dict[int, str]:
    """The offsets of ``source``'s decisions among ``records`` (foreign bytes are skipped)."""
    found: dict[int, str] = {}
    for offset, value in records.items():
        with contextlib.suppress(Exception):
            event = avro.decode_event(value)
            if event.source == source and not isinstance(event, JobEnqueued):
                found[offset] = type(event).__name__
    return found


async def _catch_open_transaction(
    stack: Stack, node: Proc, committed: Consumer, uncommitted: Consumer
) -> tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
    """Freeze ``node`` with a transaction holding decisions and effects open; its gaps."""
    topics, partitions = stack.topics, stack.partitions
    for _ in range(CATCH_TRIES):
        node.signal(signal.SIGSTOP)
        events = _gaps(committed, uncommitted, topics.events, partitions)
        effects = _gaps(committed, uncommitted, topics.effects, 1)
        if events and effects:
            return events, effects
        node.signal(signal.SIGCONT)
        await asyncio.sleep(0.05)  # let it reach its next transaction
    raise AssertionError(f"no transaction caught open in {CATCH_TRIES} freezes")


def _log_lines(proc: Proc, event: str) -> list[dict[str, object]]:
    lines = []
    for line in proc.log().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("event") == event:
                lines.append(entry)
    return lines


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_a_frozen_nodes_open_transaction_aborts_decisions_effects_and_offsets(
    stack: Stack,
) -> None:
    zombie = stack.start_node("node-1", "--dispatch-timeout-s", "5")
    await wait_for(lambda: _logged(zombie, "partition_assigned"), what="node-1 to own")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16")
    with _probes(stack) as (committed, uncommitted):
        async with _load(stack) as jobs:
            await wait_for(succeeded_at_least(stack, jobs, 20), what="a flow of jobs")
            events_gaps, effects_gaps = await _catch_open_transaction(
                stack, zombie, committed, uncommitted
            )
            # What the group's offsets were, open transaction aside.
            offsets_before = {p: await stack.node_committed(p) for p in range(stack.partitions)}
        heir = stack.start_node("node-2", "--dispatch-timeout-s", "5")
        await wait_for(
            lambda: _as_async(len(_log_lines(heir, "partition_assigned")) >= stack.partitions),
            what="node-2 to take every partition over",
            timeout_s=90,
        )
        zombie.signal(signal.SIGCONT)
        jobs = list(jobs)
        await wait_for(lambda: all_terminal(stack, jobs), what="every job to end", timeout_s=120)
        assert await succeeded_count(stack, jobs) == len(jobs)

        # The open transaction's decisions and effects were written, and never became visible.
        aborted_decisions = 0
        for p, (start, end) in events_gaps.items():
            written = _nodes_decisions(
                _read(uncommitted, stack.topics.events, p, start, end), "node-node-1"
            )
            visible = _read(committed, stack.topics.events, p, start, end)
            assert not written.keys() & visible.keys(), (p, written, sorted(visible))
            aborted_decisions += len(written)
        assert aborted_decisions > 0
        for p, (start, end) in effects_gaps.items():
            assert _read(uncommitted, stack.topics.effects, p, start, end)
            assert _read(committed, stack.topics.effects, p, start, end) == {}

    # Its offsets too: the heir found the group's offsets as they were before that transaction.
    taken = {
        int(str(e["partition"])): e["committed"] for e in _log_lines(heir, "partition_assigned")
    }
    assert taken == offsets_before
    # And the zombie learnt it was fenced rather than committing.
    assert any(e["fenced"] for e in _log_lines(zombie, "transaction_failed"))
    assert zombie.popen.poll() is None and heir.popen.poll() is None
    await stack.check()


async def _as_async(value: bool) -> bool:
    return value
