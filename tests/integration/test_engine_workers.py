"""Workers that die or freeze mid-job, on real processes: SIGKILL, SIGSTOP and SIGCONT.

Each test has a namespace and a Stack of its own (one node; workers started and signalled by the
test) and ends with ``stack.check()``: I1/I6/I7 on what is in the log, the effects topic equal to
the effects of applied successes, every job terminal.

Timing. Workers hold a 2 s run lease (renewed every 2/3 s). A worker that is killed or frozen
stays in the pool's consumer group until the group's session timeout (aiokafka's default, 10 s)
evicts it; until then the dispatch partitions it was assigned have no reader, so the re-lease of
its job waits there. A start lease (``--dispatch-timeout-s``) shorter than that expires unstarted,
and each such expiry counts an attempt (DESIGN.md section 4): with 3 s a single crash burns two
or three of ``s.gated``'s five attempts and the job can die. The node here gives 15 s to start,
which keeps the tests deterministic (the rerun is attempt 2, token 2) without making them slower:
the rerun starts as soon as the surviving worker is assigned the partition.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytest_asyncio
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaTimeoutError
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, effect_id, wait_for

from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed
from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.events import AttemptCheckpointed, AttemptStarted, Event
from evsched.core.state import JobState, Status, TimelineEntry, Verdict

pytestmark = pytest.mark.asyncio
# The scenarios need the broker (their ``stack`` fixture asks for it) and take ~12 s each.
scenario = pytest.mark.slow

LEASE_S = "2"
DISPATCH_TIMEOUT_S = "15"
STEPS = 8


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("crash")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    home = tmp_path / "stack"
    home.mkdir()
    engine = Stack(kafka_bootstrap, namespace, home)
    engine.start_node("node-1", "--dispatch-timeout-s", DISPATCH_TIMEOUT_S)
    try:
        yield engine
    finally:
        await engine.close()


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


def start_worker(stack: Stack, name: str) -> Proc:
    return stack.start_worker(name, "--lease-s", LEASE_S)


# --- what the handlers and the log say ------------------------------------------------------------


def started_marks(marks: Path) -> list[tuple[int, int]]:
    """(attempt, token) of every ``started-<attempt>-<token>`` marker, in order."""
    found = (re.fullmatch(r"started-(\d+)-(\d+)", p.name) for p in marks.iterdir())
    return sorted((int(m[1]), int(m[2])) for m in found if m)


def step_marks(marks: Path) -> dict[int, list[int]]:
    """The steps each attempt of ``s.count`` marked, by attempt."""
    steps: dict[int, list[int]] = {}
    for path in marks.iterdir():
        if m := re.fullmatch(r"a(\d+)-s(\d+)", path.name):
            steps.setdefault(int(m[1]), []).append(int(m[2]))
    return {attempt: sorted(found) for attempt, found in steps.items()}


async def wait_path(path: Path) -> None:
    async def exists() -> bool:
        return await asyncio.to_thread(path.exists)

    await wait_for(exists, what=f"the marker {path.name}", timeout_s=30)


def pid_of(worker_id: str | None) -> int:
    """The pid inside a default worker id, ``<host>-<pid>-<hex>``."""
    assert worker_id is not None
    return int(worker_id.rsplit("-", 2)[1])


async def judged(stack: Stack, job_id: str) -> list[tuple[Event, TimelineEntry]]:
    """After ``stack.check()``: the job's events as read back from the log, with their verdicts."""
    folded = await stack.check()
    events, _ = await stack.history()
    at = {(p.partition, p.offset): e for e, p in events}
    return [(at[(t.partition, t.offset)], t) for t in folded.job_timelines[job_id]]


def tokens(pairs: list[tuple[Event, TimelineEntry]], kind: str, verdict: Verdict) -> list[int]:
    """Tokens of the job's ``kind`` events that got ``verdict``, in log order."""
    return [
        t.token for _, t in pairs if t.kind == kind and t.verdict is verdict and t.token is not None
    ]


async def published(stack: Stack, job_id: str) -> list[tuple[str, int, int]]:
    """(job, token, index) of the job's records on the effects topic."""
    records = await stack.read_raw(stack.topics.effects)
    return sorted(effect_id(r) for r in records if r.key == job_id.encode())


async def wait_published(stack: Stack, job_id: str, token: int) -> None:
    """The node publishes a success's effects after the worker wrote it: wait for them."""

    async def there() -> bool:
        return bool(await published(stack, job_id))

    await wait_for(there, what=f"the effects of job {job_id}")
    assert await published(stack, job_id) == [(job_id, token, 0)]


async def wait_running(stack: Stack, job_id: str, worker: Proc) -> JobState:
    """Until ``worker`` runs the job (the replica shows its AttemptStarted applied)."""

    async def on_worker() -> JobState | None:
        state = await stack.job(job_id)
        if state is None or state.status is not Status.RUNNING:
            return None
        return state if pid_of(state.worker_id) == worker.pid else None

    return await wait_for(on_worker, what=f"job {job_id} running on {worker.name}")


async def wait_judged(stack: Stack, job_id: str, kind: str, token: int) -> TimelineEntry:
    """Until the replica folded the job's ``kind`` event with ``token``; its timeline entry."""

    async def found() -> TimelineEntry | None:
        hits = [t for t in await stack.timeline(job_id) if t.kind == kind and t.token == token]
        return hits[0] if hits else None

    return await wait_for(found, what=f"{kind} of token {token} to be folded")


def assert_ran_once_each(
    pairs: list[tuple[Event, TimelineEntry]], frozen: Proc, rerun_on: Proc, token: int
) -> None:
    """Token 1 ran on the frozen worker only, and the rerun's token on the other one only.

    Woken up, the frozen worker finds itself evicted from the pool's group: whatever dispatch
    records it still fetches belong to the other worker now, which gets them too.
    """
    started = [(e.token, pid_of(e.worker_id)) for e, _ in pairs if isinstance(e, AttemptStarted)]
    assert started == [(1, frozen.pid), (token, rerun_on.pid)], started


# --- the scenarios --------------------------------------------------------------------------------


@pytest.mark.broker
@scenario
async def test_killed_worker_job_runs_again_and_commits_once(stack: Stack, marks: Path) -> None:
    a = start_worker(stack, "worker-a")
    async with stack.app() as app:
        job_id = await app.enqueue("s.gated", str(marks), "killed")
    await wait_path(marks / "started-1-1")
    a.kill()  # mid-job: it holds token 1, its handler waits for `go`
    b = start_worker(stack, "worker-b")
    await wait_running(stack, job_id, b)
    (marks / "go").touch()
    state = await stack.wait_status(job_id, Status.SUCCEEDED)
    await wait_published(stack, job_id, state.token)

    pairs = await judged(stack, job_id)
    assert started_marks(marks) == [(1, 1), (2, 2)]
    assert (state.attempt, state.token, json.loads(state.result or b"")) == (2, 2, "killed")
    started = [(e.token, pid_of(e.worker_id)) for e, _ in pairs if isinstance(e, AttemptStarted)]
    assert started == [(1, a.pid), (2, b.pid)]
    # The node expired the killed token; the rerun is the one applied success, and token 1 has
    # no success at all (it never got to write one).
    assert tokens(pairs, "LeaseExpired", Verdict.APPLIED) == [1]
    assert tokens(pairs, "AttemptSucceeded", Verdict.APPLIED) == [2]
    assert [t.token for _, t in pairs if t.kind == "AttemptSucceeded"] == [2]
    assert await published(stack, job_id) == [(job_id, 2, 0)]


@pytest.mark.broker
@scenario
async def test_rerun_resumes_from_the_last_checkpoint(stack: Stack, marks: Path) -> None:
    a = start_worker(stack, "worker-a")
    async with stack.app() as app:
        job_id = await app.enqueue("s.count", str(marks), STEPS)
    await wait_path(marks / "a1-s3")
    a.kill()
    start_worker(stack, "worker-b")
    state = await stack.wait_status(job_id, Status.SUCCEEDED)
    await wait_published(stack, job_id, state.token)

    pairs = await judged(stack, job_id)
    saved = {token: checkpoints(pairs, token) for token in (1, 2)}
    last = saved[1][-1]  # the last checkpoint accepted from the killed attempt
    assert saved[1] == list(range(1, last + 1)) and last >= 3
    steps = step_marks(marks)
    assert sorted(steps) == [1, 2] and state.attempt == 2
    # The killed attempt marked every step it saved (but maybe not the last: it may have died
    # between the checkpoint's ack and the marker); the rerun started right after that checkpoint.
    assert steps[1] in (list(range(1, last + 1)), list(range(1, last)))
    assert steps[2] == list(range(last + 1, STEPS + 1))
    assert saved[2] == steps[2]
    assert json.loads(state.checkpoint or b"") == STEPS
    assert json.loads(state.result or b"") == STEPS
    assert tokens(pairs, "LeaseExpired", Verdict.APPLIED) == [1]
    assert tokens(pairs, "AttemptSucceeded", Verdict.APPLIED) == [2]


def checkpoints(pairs: list[tuple[Event, TimelineEntry]], token: int) -> list[int]:
    """The values of the checkpoints applied under ``token``, in log order."""
    return [
        json.loads(e.checkpoint)
        for e, t in pairs
        if isinstance(e, AttemptCheckpointed) and t.token == token and t.verdict is Verdict.APPLIED
    ]


@pytest.mark.broker
@scenario
async def test_frozen_worker_completion_is_stale_while_the_rerun_runs(
    stack: Stack, marks: Path
) -> None:
    a = start_worker(stack, "worker-a")
    async with stack.app() as app:
        job_id = await app.enqueue("s.gated_each", str(marks), "frozen")
    await wait_path(marks / "started-1-1")
    a.signal(signal.SIGSTOP)
    b = start_worker(stack, "worker-b")
    rerun = await wait_running(stack, job_id, b)
    assert rerun.token >= 2
    await wait_path(marks / f"started-{rerun.attempt}-{rerun.token}")

    # A wakes up past its lease and finishes with token 1 while B's token is live: stale.
    a.signal(signal.SIGCONT)
    (marks / "go-1").touch()
    late = await wait_judged(stack, job_id, "AttemptSucceeded", 1)
    assert late.verdict is Verdict.STALE, late
    assert (marks / "finished-1-1").exists()
    state = await stack.job(job_id)
    assert state is not None and (state.status, state.token) == (Status.RUNNING, rerun.token)
    await stack.wait_node_past(late.partition, late.offset)
    assert await published(stack, job_id) == []  # the node folded it and published nothing

    (marks / f"go-{rerun.token}").touch()
    done = await stack.wait_status(job_id, Status.SUCCEEDED)
    await wait_published(stack, job_id, rerun.token)
    pairs = await judged(stack, job_id)
    assert done.token == rerun.token and pid_of(done.worker_id) == b.pid
    assert tokens(pairs, "AttemptSucceeded", Verdict.APPLIED) == [rerun.token]
    assert tokens(pairs, "AttemptSucceeded", Verdict.STALE) == [1]
    assert 1 in tokens(pairs, "LeaseExpired", Verdict.APPLIED)
    assert_ran_once_each(pairs, a, b, rerun.token)
    assert a.popen.poll() is None  # the frozen worker lived on


@pytest.mark.broker
@scenario
async def test_frozen_worker_completing_after_the_rerun_committed_is_stale(
    stack: Stack, marks: Path
) -> None:
    a = start_worker(stack, "worker-a")
    async with stack.app() as app:
        job_id = await app.enqueue("s.gated", str(marks), "frozen")
    await wait_path(marks / "started-1-1")
    a.signal(signal.SIGSTOP)
    b = start_worker(stack, "worker-b")
    rerun = await wait_running(stack, job_id, b)
    await wait_path(marks / f"started-{rerun.attempt}-{rerun.token}")
    (marks / "go").touch()
    done = await stack.wait_status(job_id, Status.SUCCEEDED)
    assert done.token == rerun.token >= 2
    await wait_published(stack, job_id, rerun.token)

    a.signal(signal.SIGCONT)  # its handler sees `go` and completes with token 1
    late = await wait_judged(stack, job_id, "AttemptSucceeded", 1)
    # An older token is stale whatever became of the job (DESIGN.md section 4,
    # tests/unit/core/test_fold_table.py); nothing changes and no effect is published.
    assert late.verdict is Verdict.STALE, late
    await stack.wait_node_past(late.partition, late.offset)

    pairs = await judged(stack, job_id)
    assert (marks / "finished-1-1").exists()
    assert tokens(pairs, "AttemptSucceeded", Verdict.APPLIED) == [rerun.token]
    assert await published(stack, job_id) == [(job_id, rerun.token, 0)]
    assert 1 in tokens(pairs, "LeaseExpired", Verdict.APPLIED)
    assert_ran_once_each(pairs, a, b, rerun.token)


# --- the zombie's fetch, deterministically ------------------------------------------------------


class _RefusingConsumer:
    """Fetches one dispatch record, then fails the commit of it with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def paused(self) -> set[TopicPartition]:
        return set()

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("ns.dispatch.default", 0)}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}  # the commit records the topic's partition count (kafka_feed.LAYOUT)

    async def getmany(
        self, *_: object, **__: object
    ) -> dict[TopicPartition, list[SimpleNamespace]]:
        tp = TopicPartition("ns.dispatch.default", 0)
        raw = SimpleNamespace(
            topic=tp.topic,
            partition=0,
            offset=7,
            timestamp=1,
            key=b"job",
            value=b"dispatch",
            headers=[],
        )
        return {tp: [raw]}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "runs"),
    [
        # The group rebalanced under the worker (it was evicted, e.g. frozen past the session
        # timeout): the record's partition is another member's now, which reads it again.
        (CommitFailedError("the group has already rebalanced"), 0),
        # A rebalance began (or ended) without the record's partition here: the same.
        (IllegalStateError("No partitions assigned"), 0),
        # Any other commit failure: run it; at worst it is dispatched twice, and fenced.
        (KafkaTimeoutError(), 1),
    ],
)
async def test_a_worker_runs_no_record_whose_commit_the_group_refused(
    error: Exception, runs: int
) -> None:
    feed = KafkaDispatchFeed(lambda: _RefusingConsumer(error))
    await feed.start()
    assert len(await feed.take(5, 0.1)) == runs
