"""Broker faults under load with the whole stack on the three-broker cluster (issue 12, item 2).

Each test runs a node and a worker process and a load of ``cluster_load.RATE_PER_S`` enqueues a
second through the client on a fresh namespace (RF 3, min ISR 2), deals a fault to the brokers
with real signals, and ends with the checks over the whole log (``Loaded.finish``). The module
shares one cluster; ``healed`` brings every broker back after each test. Each test prints its
figures (``-s`` shows them).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from tests.integration.cluster_load import (
    PARTITIONS,
    Loaded,
    first_leases_after,
    loaded_stack,
    node_log_counts,
)
from tests.integration.clusters import all_in_sync, heal, kill, module_cluster
from tests.integration.engine import REPO, wait_for

from evsched.adapters.kafka.queues import FixedQueues
from evsched.adapters.kafka.topics import topic_specs
from evsched.api import create_app
from evsched.devstack.cluster import LocalCluster

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.cluster, pytest.mark.timeout(900)]

# From a leader's SIGKILL to the node's first lease on each partition it led. The controller
# fences the dead broker after broker.session.timeout.ms (9 s) and elects new leaders; the node's
# transaction then completes on them (or its step fails and the partition reopens with a new
# producer). Measured 10-20 s on a loaded 2-core box (docs/operations.md); the bound leaves room.
RECOVERY_BOUND_S = 45.0
# How long after its call a client's enqueue may take to fail while the ISR is short: the first
# look at the partition comes after CHECK_AFTER_S (1 s), a describe of the topic takes the rest.
FAIL_FAST_BOUND_S = 10.0
# The same for `evsched enqueue --no-wait`, from the process's start to its exit: mostly Python's
# start and the CLI's imports (31 s of the 49 s measured on the loaded box; then the producer's
# start, the failed append within FAIL_FAST_BOUND_S, and a close that drops the refused record).
CLI_BOUND_S = 120.0
API_TOKEN = "cluster-faults-write-token"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with module_cluster(tmp_path_factory.mktemp("faults")) as local:
        yield local


@pytest.fixture
async def healed(cluster: LocalCluster) -> AsyncIterator[LocalCluster]:
    """The cluster, whole again after the test (killed nodes started, frozen ones thawed)."""
    await heal(cluster)
    try:
        yield cluster
    finally:
        await heal(cluster)


async def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """Partition -> leader's node id, once the broker asked lists every partition with one (a
    broker restarted by the last test may answer for a moment without the new topic)."""

    async def described() -> dict[int, int] | None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            [found] = await admin.describe_topics([topic])
        finally:
            await admin.close()
        led = {int(p["partition"]): int(p["leader"]) for p in found.get("partitions") or []}
        if len(led) == PARTITIONS and min(led.values()) >= 0:
            return led
        await asyncio.sleep(0.5)
        return None

    return await wait_for(described, what=f"a leader for every partition of {topic}", timeout_s=60)


def report(name: str, started: float, run: Loaded, **figures: object) -> None:
    load = run.load
    slowest = max(load.acked.values(), default=0.0)
    print(
        f"\n{name}: {time.monotonic() - started:.1f} s, acked={len(load.acked)} "
        f"failed={len(load.failed)} slowest_ack_s={slowest:.2f} "
        + " ".join(f"{k}={v}" for k, v in figures.items())
        + f" node_log={node_log_counts(run.stack, 'partition_step_failed', 'partition_recovered')}"
    )


async def test_a_killed_leader_under_load_loses_nothing_and_the_node_resumes_within_the_bound(
    healed: LocalCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    async with loaded_stack(healed.bootstrap, tmp_path, "fkill") as run:
        await run.acked_past(40)
        led = await leaders(healed.bootstrap, run.stack.topics.events)
        victim = led[0]
        partitions = {p for p, leader in led.items() if leader == victim}
        killed_at_ms = time.time() * 1000
        await kill(healed, victim)

        async def resumed() -> dict[int, float] | None:
            first = await first_leases_after(run.stack, killed_at_ms)
            if partitions <= set(first):
                return {p: first[p] for p in partitions}
            await asyncio.sleep(0.5)
            return None

        stalls = await wait_for(resumed, what=f"leases again on {partitions}", timeout_s=180)
        await run.acked_past(40)
        await run.finish()
    report("leader kill", started, run, victim=victim, recovery_s=stalls)
    assert not run.load.failed, run.load.failed[:3]
    assert max(stalls.values()) <= RECOVERY_BOUND_S, stalls


async def test_a_broker_frozen_past_its_session_timeout_under_load_loses_nothing(
    healed: LocalCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    async with loaded_stack(healed.bootstrap, tmp_path, "ffrz") as run:
        await run.acked_past(40)
        victim = (await leaders(healed.bootstrap, run.stack.topics.events))[1]
        pid = healed.node(victim).status().pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            # Past broker.session.timeout.ms (9 s): the controller fences it and the others
            # take over its partitions; jobs go on being acknowledged meanwhile.
            frozen_at = time.monotonic()
            await run.acked_past(60, timeout_s=180)
            await wait_for(
                lambda: _gone_from_isr(healed.bootstrap, run.stack.topics.events, victim),
                what=f"broker {victim} out of the ISRs",
                timeout_s=120,
            )
            frozen_s = time.monotonic() - frozen_at
        finally:
            os.kill(pid, signal.SIGCONT)
        await wait_for(lambda: _in_sync(healed), what="the thawed broker in sync", timeout_s=180)
        await run.acked_past(40)
        await run.finish()
    report("broker freeze", started, run, victim=victim, frozen_s=round(frozen_s, 1))
    assert not run.load.failed, run.load.failed[:3]


async def test_a_rolling_restart_of_every_broker_under_load_loses_nothing(
    healed: LocalCluster, tmp_path: Path
) -> None:
    started = time.monotonic()
    async with loaded_stack(healed.bootstrap, tmp_path, "froll") as run:
        await run.acked_past(40)
        for node in healed.nodes:
            await asyncio.to_thread(node.down)  # SIGTERM: a controlled shutdown
            await run.acked_past(10, timeout_s=180)  # the others carry on meanwhile
            await asyncio.to_thread(healed.up)
            await wait_for(lambda: _in_sync(healed), what="every ISR whole", timeout_s=180)
        await run.acked_past(40)
        await run.finish()
    report("rolling restart", started, run)
    assert not run.load.failed, run.load.failed[:3]


async def test_fewer_than_min_isr_replicas_fail_writes_fast_and_clearly_and_lose_nothing(
    healed: LocalCluster, tmp_path: Path
) -> None:
    """On this combined-mode cluster two nodes down would also take the KRaft quorum away, so
    the events topic asks for 3 in-sync replicas and one broker goes down: the same state
    (ISR below min ISR) as two brokers down on a cluster with separate controllers."""
    started = time.monotonic()
    async with loaded_stack(healed.bootstrap, tmp_path, "fisr") as run:
        events = run.stack.topics.events
        await _set_min_isr(healed.bootstrap, run.stack.namespace, 3)
        await run.stack.replica()  # the API's, started while every broker is up
        await run.acked_past(40)
        victim = 3
        await kill(healed, victim)
        await wait_for(
            lambda: _gone_from_isr(healed.bootstrap, events, victim),
            what=f"broker {victim} out of the ISRs",
            timeout_s=120,
        )
        short_at_ms = time.time() * 1000

        async def failing() -> bool:
            if len(_called_after(run, short_at_ms)) >= 20:
                return True
            await asyncio.sleep(0.2)
            return False

        await wait_for(failing, what="enqueues to fail", timeout_s=60)
        api = await _api_enqueue(run)
        cli = await _cli_enqueue(run)
        await asyncio.to_thread(healed.up)
        await wait_for(lambda: _in_sync(healed), what="every ISR whole", timeout_s=180)
        await run.acked_past(40)
        await run.finish()
    report("min isr", started, run, api=api[:1] + api[2:], cli=cli[:1] + cli[2:])
    during = _called_after(run, short_at_ms)
    assert {kind for _, kind, _, _ in during} == {"NotEnoughReplicas"}, during[:3]
    assert all("min.insync.replicas=3" in message for _, _, message, _ in during), during[:3]
    assert max(took for *_, took in during) <= FAIL_FAST_BOUND_S, during
    status, body, api_s = api
    assert status == 503, body
    assert api_s <= FAIL_FAST_BOUND_S, api
    assert body["error"]["code"] == "not_enough_replicas", body
    assert "min.insync.replicas=3" in body["error"]["message"], body
    code, err, cli_s = cli
    assert code == 4, err
    assert cli_s <= CLI_BOUND_S, cli
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "min.insync.replicas=3" in err, err


def _called_after(run: Loaded, at_ms: float) -> list[tuple[float, str, str, float]]:
    """The failed enqueues called after ``at_ms`` (wall clock)."""
    return [failed for failed in run.load.failed if failed[0] >= at_ms]


async def _gone_from_isr(bootstrap: str, topic: str, node_id: int) -> bool:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5_000)
    try:
        await admin.start()
        [found] = await admin.describe_topics([topic])
    except KafkaError:  # it asked the broker that is down: ask again
        await asyncio.sleep(0.5)
        return False
    finally:
        await admin.close()
    partitions = found.get("partitions") or []
    if len(partitions) == PARTITIONS and all(node_id not in p["isr"] for p in partitions):
        return True
    await asyncio.sleep(0.5)
    return False


async def _in_sync(cluster: LocalCluster) -> bool:
    if await all_in_sync(cluster.bootstrap):
        return True
    await asyncio.sleep(0.5)
    return False


async def _set_min_isr(bootstrap: str, namespace: str, count: int) -> None:
    """The events topic's min ISR raised (a higher one passes evsched's check). AlterConfigs
    replaces a topic's whole config: evsched's own configs go with it."""
    [events, *_] = topic_specs(namespace, event_partitions=PARTITIONS, queues=["default"])
    configs = {**events.configs, "min.insync.replicas": str(count)}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, events.name, configs)])
    finally:
        await admin.close()


async def _api_enqueue(run: Loaded) -> tuple[int, dict[str, object], float]:
    """POST /v1/jobs through the API (in process) while the ISR is short: (status, body,
    seconds the request took)."""
    async with run.stack.app() as client:
        app = create_app(
            run.stack.settings,
            replica=await run.stack.replica(),
            app=client,
            token=API_TOKEN,
            wait_timeout_s=10.0,
            queues=FixedQueues(["default"]),
        )
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            called = time.monotonic()
            answer = await asyncio.wait_for(
                http.post(
                    "/v1/jobs",
                    json={"task": "s.noop"},
                    headers={"Authorization": f"Bearer {API_TOKEN}"},
                ),
                timeout=30,
            )
            took = time.monotonic() - called
    return answer.status_code, answer.json(), round(took, 1)


async def _cli_enqueue(run: Loaded) -> tuple[int, str, float]:
    """``evsched enqueue s.noop`` as a process while the ISR is short: (exit code, stderr,
    seconds from its start to its exit)."""
    env = {**run.stack.env(), "EVSCHED_REPLICA_DATA_DIR": str(run.stack.tmp / "cli-replica")}
    called = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "evsched", "enqueue", "s.noop", "--no-wait",
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), timeout=CLI_BOUND_S + 30)
    took = time.monotonic() - called
    assert process.returncode is not None
    print(f"cli: exit {process.returncode}, stdout {out.decode()!r}, stderr {err.decode()!r}")
    return process.returncode, err.decode(), round(took, 1)
