"""The job lifecycle end to end: a real node and worker process on the real broker.

Every test ends by reading the topics back from the start and checking I1/I6/I7 and that the
effects topic holds exactly the effects of applied successes.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Stack, wait_for
from tests.prometheus import Samples, parse, total

from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.state import Status, Verdict
from evsched.devstack.process import free_port

pytestmark = [pytest.mark.broker, pytest.mark.asyncio(loop_scope="module")]
COMPLETIONS = ("AttemptSucceeded", "AttemptFailed")


NODE_METRICS, WORKER_METRICS = free_port(), free_port()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    namespace = unique_name("life")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path_factory.mktemp("life"))
    engine.start_node("node-1", "--dispatch-timeout-s", "5", "--metrics-port", str(NODE_METRICS))
    engine.start_worker(
        "worker-1", "--lease-s", "3", "--concurrency", "8", "--metrics-port", str(WORKER_METRICS)
    )
    try:
        yield engine
        # What the whole module left in the log must hold together.
        await engine.check(all_terminal=False)
    finally:
        await engine.close()


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def checked(stack: Stack) -> AsyncIterator[None]:
    """After every test: I1/I6/I7 and effects == effects of applied successes, on the real log."""
    yield
    await stack.check(all_terminal=False)


def verdicts(stack: Stack, job_id: str) -> list[tuple[str, Verdict]]:
    replica = stack._replica
    assert replica is not None
    return [(e.kind, e.verdict) for e in replica.timeline(job_id)]


async def test_happy_path_runs_once_and_publishes_its_effect(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.enqueue("s.effect", "happy")
    state = await stack.wait_status(job_id, Status.SUCCEEDED)
    assert state.attempt == 1 and state.token == 1
    assert json.loads(state.result or b"null") == "happy"
    assert [k for k, v in verdicts(stack, job_id) if v is Verdict.APPLIED] == [
        "JobEnqueued",
        "JobLeased",
        "AttemptStarted",
        "AttemptSucceeded",
    ]

    async def effect_published() -> bool:
        records = await stack.read_raw(stack.topics.effects)
        return any(r.key == job_id.encode() for r in records)

    await wait_for(effect_published, what="the effect on the effects topic")


async def scrape(port: int) -> Samples:
    """One process's /metrics; empty while it is not up."""
    try:
        async with httpx.AsyncClient() as http:
            return parse((await http.get(f"http://127.0.0.1:{port}/metrics")).text)
    except httpx.TransportError:
        return {}


async def test_node_and_worker_serve_prometheus_metrics(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.enqueue("s.effect", "metered")
    await stack.wait_status(job_id, Status.SUCCEEDED)

    async def counted() -> bool:
        node, worker = await scrape(NODE_METRICS), await scrape(WORKER_METRICS)
        folded = total(
            node, "evsched_events_folded_total", kind="AttemptSucceeded", verdict="applied"
        )
        ran = total(worker, "evsched_worker_attempts_total", task="s.effect", outcome="reported")
        return folded >= 1 and ran >= 1

    await wait_for(counted, what="the success counted by the node and the worker")
    node, worker = await scrape(NODE_METRICS), await scrape(WORKER_METRICS)
    assert total(node, "evsched_node_partitions_owned") == stack.partitions
    assert total(node, "evsched_node_transactions_total") >= 1
    assert total(node, "evsched_node_decisions_total") >= 2  # at least this job's lease + dispatch
    assert total(node, "evsched_node_effects_published_total") >= 1
    assert total(node, "evsched_start_lateness_seconds_count") >= 1
    assert total(worker, "evsched_worker_attempt_seconds_count", task="s.effect") >= 1
    assert total(worker, "evsched_worker_running_attempts") >= 0
    # What the alert rules read: each partition's owner, and the queues workers serve.
    owned = {
        dict(labels)["partition"] for name, labels in node if name == "evsched_node_partition_owned"
    }
    assert owned == {str(p) for p in range(stack.partitions)}
    assert total(worker, "evsched_worker_queues", queue="default") == 1


async def test_delayed_job_never_starts_before_run_at(stack: Stack) -> None:
    async with stack.app() as app:
        before = time.time_ns() // 1_000_000
        job_id = await app.get_task("s.noop").options(delay=timedelta(seconds=2)).enqueue()
    state = await stack.wait_status(job_id, Status.SUCCEEDED)
    timeline = await stack.timeline(job_id)
    started = [
        e.log_at for e in timeline if e.kind == "AttemptStarted" and e.verdict is Verdict.APPLIED
    ]
    assert started and min(started) >= state.run_at
    # run_at is the client's clock plus the delay; enqueued_at is the broker's append time, later
    # by the produce's round trip (hundreds of ms on a loaded box), so the delay is judged from
    # the client's clock before the call.
    assert state.run_at >= before + 2_000


async def test_delayed_jobs_are_pre_leased_and_start_at_run_at_by_the_log(stack: Stack) -> None:
    async with stack.app() as app:
        task = app.get_task("s.noop").options(delay=timedelta(seconds=3))
        job_ids = [await task.enqueue() for _ in range(10)]
    for job_id in job_ids:
        await stack.wait_status(job_id, Status.SUCCEEDED)
    for job_id in job_ids:
        state, timeline = await stack.job(job_id), await stack.timeline(job_id)
        assert state is not None
        applied = [e for e in timeline if e.verdict is Verdict.APPLIED]
        [lease] = [e for e in applied if e.kind == "JobLeased"]
        [start] = [e for e in applied if e.kind == "AttemptStarted"]
        # The node (default --prelease-ms 1000) leased it ahead; the worker held the dispatch
        # and started it at run_at: the fold refuses any start logged earlier (I6 by log time).
        assert lease.log_at < state.run_at <= start.log_at, (job_id, lease, start, state.run_at)
        assert "pre-leased" in lease.reason


async def test_retry_with_backoff_then_success(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.enqueue("s.flaky", 2)
    state = await stack.wait_status(job_id, Status.SUCCEEDED)
    assert state.attempt == 3 and state.token == 3
    timeline = (await stack.replica()).timeline(job_id)
    failures = [e for e in timeline if e.kind == "AttemptFailed"]
    leases = [e for e in timeline if e.kind == "JobLeased" and e.verdict is Verdict.APPLIED]
    starts = [e for e in timeline if e.kind == "AttemptStarted" and e.verdict is Verdict.APPLIED]
    assert len(failures) == 2 and len(leases) == 3 and len(starts) == 3
    # The second attempt started at least the 300 ms backoff after the first failure (its lease
    # may come earlier: a retry due within the node's pre-lease horizon is pre-leased).
    assert starts[1].log_at - failures[0].log_at >= 300
    assert starts[2].log_at - failures[1].log_at >= 600


async def test_permanent_failure_is_dead_at_once(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.enqueue("s.permanent")
    state = await stack.wait_status(job_id, Status.DEAD)
    assert state.attempt == 1
    assert state.last_error is not None and not state.last_error.retryable
    assert state.last_error.error_type.endswith("ValueError")

    async def dead_letter_counted() -> bool:
        return total(await scrape(NODE_METRICS), "evsched_dead_letters_total", queue="default") >= 1

    await wait_for(dead_letter_counted, what="the dead letter counted by the node")


async def test_exhausted_attempts_dead_letter_then_requeue_runs_again(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.enqueue("s.always_fail")
        dead = await stack.wait_status(job_id, Status.DEAD)
        assert dead.attempt == 2 and dead.last_error is not None and dead.last_error.retryable
        await app.requeue(job_id, reason="upstream fixed")
        await wait_for(
            lambda: _token_at_least(stack, job_id, 3), what="a new attempt after requeue"
        )
        again = await stack.wait_status(job_id, Status.DEAD)
    assert again.token == 4  # two fresh attempts, tokens kept growing


async def _token_at_least(stack: Stack, job_id: str, token: int) -> bool:
    state = await stack.job(job_id)
    return state is not None and state.token >= token


async def test_cancel_while_scheduled_never_runs(stack: Stack) -> None:
    async with stack.app() as app:
        job_id = await app.get_task("s.noop").options(delay=timedelta(seconds=30)).enqueue()
        await stack.wait_status(job_id, Status.SCHEDULED)
        await app.cancel(job_id, reason="changed my mind")
    state = await stack.wait_status(job_id, Status.CANCELLED)
    assert state.token == 0


async def test_cancel_while_running_rejects_the_late_completion(
    stack: Stack, tmp_path: Path
) -> None:
    async with stack.app() as app:
        job_id = await app.enqueue("s.gated", str(tmp_path), "cancelled")
        await stack.wait_status(job_id, Status.RUNNING)
        await app.cancel(job_id)
        await stack.wait_status(job_id, Status.CANCELLED)
    (tmp_path / "go").touch()

    async def completion_judged() -> bool:
        # The worker's follow cancels the handler: its report is a failure (evsched.Cancelled);
        # a handler that beat the cancel to its end reports its success. Either is rejected.
        return any(k in COMPLETIONS for k, _ in verdicts(stack, job_id))

    await wait_for(completion_judged, what="the late completion to be folded")
    assert not [k for k, v in verdicts(stack, job_id) if k in COMPLETIONS and v is Verdict.APPLIED]
    effects = await stack.read_raw(stack.topics.effects)
    assert not [r for r in effects if r.key == job_id.encode()]


async def test_idempotency_key_dedupes_and_a_different_body_conflicts(stack: Stack) -> None:
    async with stack.app() as app:
        task = app.get_task("s.effect").options(idempotency_key="order-42")
        first = await task.enqueue("same")
        second = await task.enqueue("same")
        third = await task.enqueue("different")
    assert first == second == third
    await stack.wait_status(first, Status.SUCCEEDED)

    async def judged() -> list[Verdict] | None:
        found = [v for k, v in verdicts(stack, first) if k == "JobEnqueued"]
        return found if len(found) == 3 else None

    assert await wait_for(judged, what="three enqueue verdicts") == [
        Verdict.APPLIED,
        Verdict.DUPLICATE,
        Verdict.CONFLICT,
    ]


async def test_random_bytes_are_recorded_as_undecodable_and_the_node_goes_on(
    stack: Stack,
) -> None:
    producer = kafka.producer(stack.settings, client_id="it-garbage")
    await producer.start()
    try:
        sent = [
            await producer.send_and_wait(stack.topics.events, blob, key=b"garbage")
            for blob in (b"", b"\xc3\x01" + b"\x00" * 8, bytes(range(256)), b"\xc3\x01\xff")
        ]
    finally:
        await producer.stop()
    replica = await stack.replica()
    last = sent[-1]
    await replica.wait_for(last.partition, last.offset)
    bad = [e for e in replica.index(last.partition).undecodable() if e.offset >= sent[0].offset]
    assert len(bad) == 4 and all(e.verdict is Verdict.UNDECODABLE and e.reason for e in bad)
    async with stack.app() as app:
        job_id = await app.enqueue("s.noop")
    await stack.wait_status(job_id, Status.SUCCEEDED)
    _, undecodable = await stack.history()
    assert len(undecodable) >= 4
