"""Workflows under crashes, with real processes (SIGKILL, SIGSTOP) on the real broker.

A parent's worker killed mid-run; the parent's node frozen before the parent's success and
killed before it could release the child; the node killed right after it committed a release,
its index write lost. Each time the child is released exactly once, by the record of the
parent's accepted end that the resolution names (partition@offset), and runs once. Every test
ends with the whole log checked (I1/I6/I7/I8, effects equal to those of accepted successes).

Timing as in test_engine_workers: a killed worker stays in the pool's group until its session
timeout, so the node gives workers 15 s to start a lease (an unstarted expiry costs no attempt,
but 15 s keeps the rerun at attempt 2, token 2).
"""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, all_succeeded, logged, wait_for, wait_path
from tests.integration.workflow_log import judge, logged_resolutions, wait_logged

from evsched.adapters.kafka.topics import ensure_topics
from evsched.client import chain
from evsched.client.workflows import WorkflowHandle
from evsched.core.events import AttemptStarted, AttemptSucceeded
from evsched.core.state import Status, Verdict

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(300)]

LEASE_S = "2"
DISPATCH_TIMEOUT_S = "15"
# Processes started under a loaded machine (load average 20+ on 2 cores) took up to 60 s to run
# their first job: a generous deadline for anything that waits on a fresh process.
STARTUP_S = 180.0


@pytest_asyncio.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    namespace = unique_name("wfcrash")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    home = tmp_path / "stack"
    home.mkdir()
    engine = Stack(kafka_bootstrap, namespace, home)
    try:
        yield engine
    finally:
        await engine.close()


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


def start_node(stack: Stack, name: str) -> Proc:
    return stack.start_node(name, "--dispatch-timeout-s", DISPATCH_TIMEOUT_S)


def start_worker(stack: Stack, name: str) -> Proc:
    return stack.start_worker(name, "--lease-s", LEASE_S)


async def parent_and_child(stack: Stack, marks: Path) -> tuple[str, str]:
    """``chain(gated, effect)``: the parent waits for ``marks/go``; the child records an effect
    tagged with the parent's result ("parent"), which it gets as its argument."""
    async with stack.app() as app:
        gated, effect = app.get_task("s.gated"), app.get_task("s.effect")
        handle: WorkflowHandle = await app.enqueue_workflow(
            chain(gated.s(str(marks), "parent"), effect.s())
        )
    parent, child = handle.job_ids
    return parent, child


def pid_of(worker_id: str | None) -> int:
    """The pid inside a default worker id, ``<host>-<pid>-<hex>``."""
    assert worker_id is not None
    return int(worker_id.rsplit("-", 2)[1])


async def still_waiting(stack: Stack, child: str) -> None:
    """The child is waiting and nothing in the log has resolved it."""
    assert (await stack.wait_status(child, Status.WAITING)).status is Status.WAITING
    assert await logged_resolutions(stack, child) == []


async def test_a_parent_killed_mid_run_releases_its_child_once_by_the_rerun(
    stack: Stack, marks: Path
) -> None:
    start_node(stack, "node-1")
    a = start_worker(stack, "worker-a")
    parent, child = await parent_and_child(stack, marks)
    started, _, _ = await wait_logged(stack, parent, AttemptStarted)
    assert isinstance(started, AttemptStarted) and pid_of(started.worker_id) == a.pid
    a.kill()  # mid-run: token 1's handler waits for `go`, its success is never written
    b = start_worker(stack, "worker-b")

    async def rerun_on_b() -> bool:
        state = await stack.job(parent)
        running = state is not None and state.status is Status.RUNNING
        return running and state is not None and pid_of(state.worker_id) == b.pid

    await wait_for(rerun_on_b, what="the parent's rerun on worker-b", timeout_s=STARTUP_S)
    await still_waiting(stack, child)  # the killed attempt released nothing
    (marks / "go").touch()
    done = await stack.wait_status(child, Status.SUCCEEDED, timeout_s=STARTUP_S)
    assert json.loads(done.result or b"") == "parent"  # the rerun's result, passed on

    judged = await judge(stack)
    starts = [
        (j.event.token, pid_of(j.event.worker_id))
        for j in judged.of(parent, "AttemptStarted")
        if isinstance(j.event, AttemptStarted)
    ]
    assert starts == [(1, a.pid), (2, b.pid)]
    assert [j.entry.token for j in judged.of(parent, "LeaseExpired", Verdict.APPLIED)] == [1]
    assert [j.entry.token for j in judged.of(parent, "AttemptSucceeded")] == [2]
    resolution, end = judged.released_once_by_the_end(child, parent)
    assert end.entry.token == 2 and end.entry.kind == "AttemptSucceeded"
    assert resolution.outcome == "succeeded" and resolution.result == b'"parent"'
    assert resolution.source == "node-node-1"
    assert len(judged.of(child, "JobLeased", Verdict.APPLIED)) == 1
    assert len(judged.of(child, "AttemptSucceeded", Verdict.APPLIED)) == 1


async def test_a_node_frozen_before_the_parents_success_and_killed_releases_once(
    stack: Stack, marks: Path
) -> None:
    """The node is frozen before the parent ends, so the worker's success lands in the log with
    no node to fold it; the node is killed with the release owed, and its heir sends it."""
    frozen = start_node(stack, "node-1")
    start_worker(stack, "worker-1")
    parent, child = await parent_and_child(stack, marks)
    await wait_path(marks / "started-1-1", what="the parent to start", timeout_s=STARTUP_S)
    frozen.signal(signal.SIGSTOP)
    (marks / "go").touch()
    success, partition, offset = await wait_logged(stack, parent, AttemptSucceeded)
    assert isinstance(success, AttemptSucceeded) and success.token == 1
    await still_waiting(stack, child)  # the success is in the log, the release is not
    frozen.kill()
    heir = start_node(stack, "node-2")
    done = await stack.wait_status(child, Status.SUCCEEDED, timeout_s=STARTUP_S)
    assert json.loads(done.result or b"") == "parent"

    judged = await judge(stack)
    resolution, end = judged.released_once_by_the_end(child, parent)
    assert end.at == (partition, offset) and end.entry.token == 1
    assert resolution.source == "node-node-2"  # the heir's fold of the success
    assert len(judged.of(child, "JobLeased", Verdict.APPLIED)) == 1
    assert len(judged.of(child, "AttemptSucceeded", Verdict.APPLIED)) == 1
    assert logged(heir, "partition_assigned")


async def test_a_node_killed_right_after_committing_the_release_never_sends_it_again(
    stack: Stack, marks: Path, tmp_path: Path
) -> None:
    """The release is committed (its transaction carries the offset of the parent's success),
    then the node dies before its index write: its index is set back to a copy taken before
    the success (what a SIGKILL between the commit and the write leaves), and the node restarts
    on it. It must refold the gap without sending anything: no second release, no second run."""
    node = start_node(stack, "node-1")
    start_worker(stack, "worker-1")
    parent, child = await parent_and_child(stack, marks)
    await wait_path(marks / "started-1-1", what="the parent to start", timeout_s=STARTUP_S)
    node.signal(signal.SIGSTOP)  # a frozen node's files are what a SIGKILL would leave
    before_success = tmp_path / "index-before-success"
    shutil.copytree(stack.node_data("node-1"), before_success, symlinks=True)
    node.signal(signal.SIGCONT)
    (marks / "go").touch()
    done = await stack.wait_status(child, Status.SUCCEEDED, timeout_s=STARTUP_S)
    [resolution] = await logged_resolutions(stack, child)  # committed: read_committed sees it
    await stack.wait_node_past(resolution.parent_partition, resolution.parent_offset)
    node.kill()
    shutil.rmtree(stack.node_data("node-1"))
    shutil.copytree(before_success, stack.node_data("node-1"), symlinks=True)
    log_from = len(node.log())
    restarted = start_node(stack, "node-1")

    async def refolded() -> bool:
        fresh = restarted.log()[log_from:]
        return any(
            json.loads(line).get("partition") == resolution.parent_partition
            for line in fresh.splitlines()
            if '"event": "gap_refolded"' in line
        )

    await wait_for(refolded, what="the restarted node to refold the gap of the parent's partition")
    await stepped_on_every_partition(stack)

    judged = await judge(stack)
    again, end = judged.released_once_by_the_end(child, parent)
    assert again == resolution and end.entry.token == 1
    assert len(judged.of(child, "JobLeased", Verdict.APPLIED)) == 1
    assert len(judged.of(child, "AttemptSucceeded", Verdict.APPLIED)) == 1
    assert json.loads(done.result or b"") == "parent"
    assert restarted.stop() == 0
    code, document = await stack.rebuild_verify("node-1", tmp_path / "rebuild")
    assert code == 0 and document["digest_match"] is True, document  # I4 after the refold


async def stepped_on_every_partition(stack: Stack) -> None:
    """No-op jobs on every partition, run to the end: the node has stepped past all that came
    before them (a second release or lease would be in the log by then)."""
    covered: set[int] = set()
    jobs: list[str] = []
    async with stack.app() as app:
        noop = app.get_task("s.noop")
        while covered != set(range(stack.partitions)):
            handle = await noop.enqueue()
            assert handle.enqueue_partition is not None and len(jobs) < 100
            covered.add(handle.enqueue_partition)
            jobs.append(str(handle))
    await wait_for(lambda: all_succeeded(stack, jobs), what="the marker jobs to run")
