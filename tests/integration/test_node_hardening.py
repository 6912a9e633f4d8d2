"""The node under load and bad decisions, with real processes on the real broker: per-queue limits
that hold across partitions, decisions quarantined while their partition proceeds, a halted
partition in /readyz, and starting against a missing broker or a misconfigured topic.

Backpressure (max unstarted per queue) is a partition's own behaviour: it is tested through
NodeDriver in tests/unit/runtime/driver/test_node_driver_failures.py."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from tests.conftest import unique_name
from tests.integration.engine import Proc, Stack, all_succeeded, wait_for
from tests.integration.node_app import make_app
from tests.prometheus import parse, total, value

from evsched.adapters.kafka.topics import TopicSpec, ensure_topics, provision, topic_specs
from evsched.core.invariants import Replay
from evsched.core.state import Status, Verdict
from evsched.devstack.process import free_port
from evsched.errors import UnknownQueue

pytestmark = pytest.mark.broker

APP = "tests.integration.node_app:app"
# Leaving an active (leased or running) status: the end of a lease's slot against the limits.
ENDS = {"AttemptSucceeded", "AttemptFailed", "LeaseExpired", "JobCancelled"}


async def make_stack(bootstrap: str, tmp: Path, partitions: int = 3) -> Stack:
    namespace = unique_name("nodeh")
    await ensure_topics(bootstrap, namespace, event_partitions=partitions, queues=["default"])
    return Stack(bootstrap, namespace, tmp, partitions=partitions)


@pytest.fixture
async def stack(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Stack]:
    engine = await make_stack(kafka_bootstrap, tmp_path)
    try:
        yield engine
    finally:
        await engine.close()


def start_worker(stack: Stack, *args: str) -> Proc:
    return stack.start_worker("worker-1", "--app", APP, "--queues", "default", *args)


async def enqueue(stack: Stack, task: str, count: int, *args: object) -> list[str]:
    async with make_app(stack.settings) as app:
        return [await app.get_task(task).enqueue(*args) for _ in range(count)]


async def statuses(stack: Stack, job_ids: list[str]) -> list[Status | None]:
    states = [await stack.job(j) for j in job_ids]
    return [None if s is None else s.status for s in states]


def max_active(folded: Replay) -> int:
    """The most jobs leased or running at once, by log time (the broker's one clock)."""
    moves: list[tuple[int, int]] = []
    for timeline in folded.job_timelines.values():
        for entry in timeline:
            if entry.verdict is not Verdict.APPLIED:
                continue
            if entry.kind == "JobLeased":
                moves.append((entry.log_at, 1))
            elif entry.kind in ENDS:
                moves.append((entry.log_at, -1))
    active = peak = 0
    for _, move in sorted(moves):  # at equal times an end (-1) sorts before a lease
        active += move
        peak = max(peak, active)
    return peak


def logged(proc: Proc, event: str) -> list[dict[str, object]]:
    lines = []
    for line in proc.log().splitlines():
        if f'"event": "{event}"' in line:
            lines.append(json.loads(line))
    return lines


async def scrape(port: int, path: str = "/metrics") -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.get(f"http://127.0.0.1:{port}{path}", timeout=10)


async def test_max_in_flight_holds_per_queue_across_all_six_partitions(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    stack = await make_stack(kafka_bootstrap, tmp_path, partitions=6)
    try:
        stack.start_node("node-1", "--max-in-flight", "3", "--dispatch-timeout-s", "30")
        start_worker(stack, "--concurrency", "20")
        jobs = await enqueue(stack, "n.sleep", 48, 0.2)
        await wait_for(lambda: all_succeeded(stack, jobs), what="every job to succeed")
        folded = await stack.check()
    finally:
        await stack.close()
    partitions = {folded.job_timelines[j][0].partition for j in jobs}
    assert len(partitions) == 6  # the jobs were spread over every partition
    # Per partition the limit was 3 before: up to 18 at once with 6 partitions.
    assert 2 <= max_active(folded) <= 3


class EveryQueue:
    """A producer that skips the declared-queue check, like a foreign or buggy one."""

    async def declared(self, queue: str) -> bool:
        return True


async def dispatch_topics(stack: Stack) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=stack.bootstrap)
    try:
        await admin.start()
        prefix = f"{stack.namespace}.dispatch."
        return {t for t in await admin.list_topics() if t.startswith(prefix)}
    finally:
        await admin.close()


async def test_a_job_on_an_undeclared_queue_waits_then_runs_soon_after_it_is_declared(
    stack: Stack,
) -> None:
    # Issue 9, D.13: the node never creates a dispatch topic, whatever queue a job names.
    port = free_port()
    node = stack.start_node("node-1", "--metrics-port", str(port))
    async with make_app(stack.settings) as app:
        with pytest.raises(UnknownQueue, match="queue 'fresh' is not declared"):
            await app.get_task("n.fresh").enqueue()  # the client refuses it, as the API does
    async with make_app(stack.settings, queues=EveryQueue()) as foreign:
        job = await foreign.get_task("n.fresh").enqueue()
    undeclared = await wait_for(
        lambda: _events(node, "queue_undeclared"), what="the queue_undeclared line"
    )
    assert undeclared[0]["queue"] == "fresh"

    async def held() -> bool:
        samples = parse((await scrape(port)).text)
        return total(samples, "evsched_node_decisions_quarantined_total", stage="undeclared") >= 2

    await wait_for(held, what="the job to be held back twice (looked at again)")
    await stack.wait_status(job, Status.SCHEDULED)  # folded, and not leased
    assert await dispatch_topics(stack) == {f"{stack.namespace}.dispatch.default"}
    assert not logged(node, "decision_quarantined")  # one line per queue, not per decision

    # An operator declares it (`evsched kafka topics --queue fresh`); a worker serves it.
    await ensure_topics(stack.bootstrap, stack.namespace, event_partitions=3, queues=["fresh"])
    declared = time.monotonic()
    stack.start_worker("worker-2", "--app", APP, "--queues", "fresh")
    await stack.wait_status(job, Status.LEASED, Status.RUNNING, Status.SUCCEEDED, timeout_s=60)
    elapsed = time.monotonic() - declared
    assert elapsed < 15, f"the job was leased {elapsed:.1f} s after its queue was declared"
    await stack.wait_status(job, Status.SUCCEEDED, timeout_s=60)


async def _has(proc: Proc, event: str) -> bool:
    return bool(logged(proc, event))


async def test_a_job_whose_dispatch_topic_is_misconfigured_is_quarantined_and_others_run(
    stack: Stack,
) -> None:
    # The queue's dispatch topic exists with 1 partition where evsched needs 3: never used so.
    (spec,) = [
        s
        for s in topic_specs(stack.namespace, event_partitions=1, queues=["misconfigured"])
        if "dispatch" in s.name
    ]
    await provision(stack.bootstrap, [spec])
    port = free_port()
    node = stack.start_node("node-1", "--metrics-port", str(port))
    start_worker(stack)
    (bad,) = await enqueue(stack, "n.misconfigured", 1)
    good = await enqueue(stack, "n.sleep", 30, 0)
    await wait_for(lambda: all_succeeded(stack, good), what="the other jobs to succeed")
    quarantined = await wait_for(
        lambda: _events(node, "decision_quarantined"), what="the quarantine log line"
    )
    assert quarantined[0]["entity"] == bad and quarantined[0]["stage"] == "topic"
    assert "partitions" in str(quarantined[0]["reason"])
    assert (await stack.job(bad)).status is Status.SCHEDULED  # type: ignore[union-attr]
    samples = parse((await scrape(port)).text)
    assert total(samples, "evsched_node_decisions_quarantined_total", stage="topic") >= 1
    assert value(samples, "process_cpu_seconds_total") > 0  # E.18: process_* and python_*
    assert total(samples, "python_info") == 1
    ready = await scrape(port, "/readyz")
    assert ready.status_code == 200, ready.text


async def _events(proc: Proc, event: str) -> list[dict[str, object]] | None:
    return logged(proc, event) or None


async def test_a_record_the_broker_refuses_quarantines_its_job_not_its_queue(
    stack: Stack,
) -> None:
    (spec,) = [
        s
        for s in topic_specs(stack.namespace, event_partitions=3, queues=["tiny"])
        if "dispatch" in s.name
    ]
    small = TopicSpec(
        name=spec.name,
        partitions=spec.partitions,
        replication_factor=spec.replication_factor,
        configs={**spec.configs, "max.message.bytes": "2000"},
    )
    await provision(stack.bootstrap, [small])
    node = stack.start_node("node-1")
    stack.start_worker("worker-1", "--app", APP, "--queues", "default,tiny")
    (big,) = await enqueue(stack, "n.tiny", 1, "x" * 5_000)  # its dispatch record is too large
    fine = await enqueue(stack, "n.tiny", 5, "ok") + await enqueue(stack, "n.sleep", 20, 0)
    await wait_for(lambda: all_succeeded(stack, fine), what="the other jobs to succeed")
    quarantined = await wait_for(
        lambda: _events(node, "decision_quarantined"), what="the quarantine log line"
    )
    assert {q["entity"] for q in quarantined} == {big}
    assert {q["stage"] for q in quarantined} == {"send"}
    assert (await stack.job(big)).status is Status.SCHEDULED  # type: ignore[union-attr]
    assert not logged(node, "partition_step_failed")


async def test_a_partition_that_cannot_step_shows_in_readyz_and_reopens_without_a_lock_error(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = unique_name("nodeh")
    specs = topic_specs(namespace, event_partitions=3, queues=["default"])
    # Effects are never held back: one the effects topic refuses halts its partition.
    specs = [
        TopicSpec(
            name=s.name,
            partitions=s.partitions,
            replication_factor=s.replication_factor,
            configs={**s.configs, "max.message.bytes": "2000"},
        )
        if s.name.endswith(".effects")
        else s
        for s in specs
    ]
    await provision(kafka_bootstrap, specs)
    stack = Stack(kafka_bootstrap, namespace, tmp_path)
    try:
        port = free_port()
        node = stack.start_node("node-1", "--metrics-port", str(port))
        start_worker(stack)
        (job,) = await enqueue(stack, "n.effect", 1, 5_000)
        partition = (await stack.replica()).partition_of(job)

        async def failing_twice() -> bool:
            fails = [
                e for e in logged(node, "partition_step_failed") if e["partition"] == partition
            ]
            return len(fails) >= 2

        await wait_for(failing_twice, what="the partition to fail, reopen and fail again")
        ready = await scrape(port, "/readyz")
        assert ready.status_code == 503
        assert f"partition {partition} failing: step failed" in ready.text
        samples = parse((await scrape(port)).text)
        assert value(samples, "evsched_node_partition_failing", partition=str(partition)) == 1
        assert "No locks available" not in node.log()
        reopened = [e for e in logged(node, "partition_assigned") if e["partition"] == partition]
        assert len(reopened) >= 2
        # The other partitions proceed.
        others = await enqueue(stack, "n.sleep", 20, 0)
        others = [j for j in others if (await stack.replica()).partition_of(j) != partition]
        await wait_for(lambda: all_succeeded(stack, others), what="other partitions' jobs")
    finally:
        await stack.close()


async def test_a_node_started_without_a_broker_waits_for_it_with_a_log_line(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    stack = Stack(nowhere, unique_name("nodeh"), tmp_path)
    try:
        node = stack.start_node("node-1")

        async def retried() -> bool:
            return len(logged(node, "broker_unavailable")) >= 2

        await wait_for(retried, what="two logged retries")
        assert node.popen.poll() is None
        assert node.stop() == 0
        assert "Traceback" not in node.log()
    finally:
        await stack.close()


async def test_a_misconfigured_events_topic_is_one_line_naming_topic_and_setting(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = unique_name("nodeh")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=1, queues=[])
    stack = Stack(kafka_bootstrap, namespace, tmp_path, partitions=3)
    try:
        node = stack.start_node("node-1")
        assert node.popen.wait(timeout=60) == 1
        output = node.log()
        assert "Traceback" not in output
        (line,) = [x for x in output.splitlines() if x.startswith("evsched node:")]
        assert f"{namespace}.events" in line and "partitions=1" in line
    finally:
        await stack.close()
