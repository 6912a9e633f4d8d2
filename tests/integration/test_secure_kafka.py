"""evsched on a SASL_SSL broker (SCRAM-SHA-512, a CA made by the test) with the ACLs per role of
docs/security.md: every process connects through the documented ``EVSCHED_KAFKA_*`` variables as
its role's user; the roles work end to end and no role writes a topic it is not meant to.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
from tests.integration.engine import wait_for
from tests.integration.scenario_app import make_app
from tests.integration.secure_stack import (
    APP,
    PROCESS_TIMEOUT_S,
    Ran,
    SecureStack,
    free_ports,
    secure_broker,
)

from evsched.adapters.kafka import clients as kafka
from evsched.adapters.kafka.rdkafka_event_log import RdkafkaEventLog
from evsched.adapters.kafka.topics import Topics
from evsched.adapters.kafka.worker_groups import WorkerGroups
from evsched.client.batch import Outcome
from evsched.devstack.certs import make_ca
from evsched.devstack.secure import SecureBroker
from evsched.errors import PublishError
from evsched.ports import Outbound
from evsched.settings import Settings

pytestmark = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(900),
]
TOKEN = "secure-integration-token"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    with secure_broker(tmp_path_factory.mktemp("secure-broker")) as started:
        yield started


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(
    broker: SecureBroker, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SecureStack]:
    """The namespace's ACLs, its topics created by the operator role."""
    secure = SecureStack(broker, tmp_path_factory.mktemp("secure-stack"))
    assert secure.add_acls() > 0
    created = await secure.run(
        "operator", "kafka", "topics", "--queue", "default", "--partitions", "2"
    )
    assert created.code == 0, created.err
    try:
        yield secure
    finally:
        await secure.close()


async def _api_job(http: httpx.AsyncClient, job_id: str) -> dict[str, Any] | None:
    try:
        response = await http.get(f"/v1/jobs/{job_id}")
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


async def test_every_role_does_its_part_of_a_job_over_sasl_ssl(stack: SecureStack) -> None:
    """API (User:api) enqueues, node and worker run it, the operator audits it, the producer
    enqueues from the CLI and the effects reader reads the accepted effect."""
    (api_port,) = free_ports(1)
    await stack.spawn("node", "node", "node", "--data-dir", str(stack.tmp / "node"))
    await stack.spawn("worker", "worker", "worker", "--app", APP)
    await stack.spawn(
        "api", "api", "api", "--port", str(api_port), "--data-dir", str(stack.tmp / "api"),
        "--app", APP, EVSCHED_API_TOKEN=TOKEN,
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{api_port}", timeout=30) as http:

        async def posted() -> dict[str, Any] | None:
            try:
                response = await http.post(
                    "/v1/jobs",
                    json={"task": "s.effect", "args": ["over-tls"]},
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
            except httpx.TransportError:
                return None  # the API is still starting
            assert response.status_code in (201, 202), response.text
            job: dict[str, Any] = response.json()
            return job

        job = await wait_for(posted, what="the API to take an enqueue", timeout_s=180)

        async def done() -> dict[str, Any] | None:
            state = await _api_job(http, job["id"])
            return state if state is not None and state["status"] == "succeeded" else None

        await wait_for(done, what="the job to succeed on the worker", timeout_s=180)

    audited = await stack.run("operator", "audit", job["id"], "--json", "--data-dir",
                              str(stack.tmp / "operator-replica"))  # fmt: skip
    assert audited.code == 0, audited.err
    document = json.loads(audited.out)
    assert document["state"]["status"] == "succeeded"
    applied = {(e["kind"], e["verdict"]) for e in document["events"]}
    assert ("AttemptSucceeded", "applied") in applied, applied

    enqueued = await stack.run("producer", "enqueue", "s.noop", "--json", "--data-dir",
                               str(stack.tmp / "producer-replica"))  # fmt: skip
    assert enqueued.code == 0, enqueued.err
    assert [w["verdict"] for w in json.loads(enqueued.out)] == ["applied"]

    effects = await _read_effects(stack, expect=1)
    assert [key for key, _ in effects] == [job["id"].encode()]


async def test_the_node_principal_sees_which_queues_the_workers_serve(stack: SecureStack) -> None:
    """Nodes lease only queues with a live worker: User:node may describe the workers' groups
    (else a node fails open and leases every queue, which the first test would not notice)."""
    await stack.spawn("worker-presence", "worker", "worker", "--app", APP, "--pool", "presence")
    pools = WorkerGroups(stack.broker.client_settings("node", stack.namespace))
    group = f"{stack.namespace}.workers.presence"
    try:

        async def served() -> Mapping[str, int] | None:
            told = await pools.pools()  # BrokerUnavailable without the ACL
            return told.get(group)

        assert await wait_for(served, what="the pool to be described", timeout_s=120) == {
            "default": 1
        }
    finally:
        await pools.close()


async def _read_effects(stack: SecureStack, *, expect: int) -> list[tuple[bytes, bytes]]:
    settings = stack.broker.client_settings("effects-reader", stack.namespace)
    consumer = kafka.consumer(
        settings, Topics(stack.namespace).effects, group_id=f"{stack.namespace}.effects.test"
    )
    await consumer.start()
    found: list[tuple[bytes, bytes]] = []
    try:

        async def fetched() -> list[tuple[bytes, bytes]] | None:
            batches = await consumer.getmany(timeout_ms=500)
            found.extend((r.key, r.value) for records in batches.values() for r in records)
            return found if len(found) >= expect else None

        return await wait_for(fetched, what=f"{expect} effect(s)", timeout_s=120)
    finally:
        await consumer.stop()


async def _write(stack: SecureStack, user: str, topic: str, **options: Any) -> None:
    settings = stack.broker.client_settings(user, stack.namespace)
    producer: AIOKafkaProducer = kafka.producer(settings, client_id=f"acl-{user}", **options)
    try:
        await producer.start()
        await asyncio.wait_for(producer.send_and_wait(topic, b"forged", key=b"job"), 60)
    finally:
        await producer.stop()


@pytest.mark.parametrize(
    ("user", "topic"),
    [
        ("producer", "dispatch.default"),
        ("producer", "effects"),
        ("api", "dispatch.default"),
        ("api", "effects"),
        ("worker", "dispatch.default"),
        ("worker", "effects"),
        ("effects-reader", "events"),
    ],
)
async def test_a_role_cannot_write_another_roles_topic(
    stack: SecureStack, user: str, topic: str
) -> None:
    # A principal allowed to write no topic at all is stopped earlier, at the idempotent
    # producer's InitProducerId (no IdempotentWrite on the cluster).
    with pytest.raises((TopicAuthorizationFailedError, ClusterAuthorizationFailedError)):
        await _write(stack, user, f"{stack.namespace}.{topic}")


async def test_a_producer_cannot_pose_as_a_node(stack: SecureStack) -> None:
    """A node's transactional id is the node's alone: no fencing a node, no forged decisions."""
    with pytest.raises(TransactionalIdAuthorizationFailed):
        await _write(
            stack, "producer", f"{stack.namespace}.events",
            transactional_id=f"{stack.namespace}.node.p0",
        )  # fmt: skip


@pytest.mark.parametrize(
    ("user", "written"), [("producer", True), ("api", True), ("worker", False)]
)
async def test_producers_and_the_api_write_atomic_batches(
    stack: SecureStack, user: str, written: bool
) -> None:
    """An atomic batch is one transaction under its writer's ``<ns>.batch.`` id: producers and
    the API (``POST /v1/jobs:batch``, same writer) may use one, a worker may not."""
    app = make_app(stack.broker.client_settings(user, stack.namespace))
    noop = app.get_task("s.noop")
    try:
        results = await asyncio.wait_for(
            app.enqueue_many([noop.call(), noop.call()], atomic=True), 120
        )
    finally:
        await app.close()
    expected = Outcome.ACCEPTED if written else Outcome.FAILED
    assert [r.outcome for r in results] == [expected] * 2, results
    if not written:  # the broker's refusal, as the client names it (aiokafka; librdkafka)
        named = ("TransactionalIdAuthorizationFailed", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")
        assert any(name in results[0].message for name in named), results


def _one_line_error(text: str, prefix: str) -> str:
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, text
    return lines[0]


# (variables that break the connection, what the one line must say)
BREAKAGES = {
    "wrong password": (
        {"EVSCHED_KAFKA_SASL_PASSWORD": "not-the-password"},
        "SASL authentication as",
    ),
    "untrusted certificate": ({}, "TLS certificate is not trusted"),
    "wrong mechanism": (
        {"EVSCHED_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256"},
        "SCRAM-SHA-256 is not enabled on the broker",
    ),
}


@pytest.mark.parametrize("breakage", list(BREAKAGES))
async def test_a_refused_connection_is_one_line_naming_the_cause(
    stack: SecureStack, breakage: str, tmp_path: Path
) -> None:
    """Node, worker, API and CLI each exit at once with one line, and no traceback."""
    env, cause = BREAKAGES[breakage]
    if breakage == "untrusted certificate":
        env = {"EVSCHED_KAFKA_SSL_CAFILE": str(make_ca(tmp_path / "other", name="other").cert)}
    (api_port,) = free_ports(1)

    def launch(user: str, *args: str, **more: str) -> Coroutine[Any, Any, Ran]:
        # timeout_s by name: else mypy takes the breakage's variables for candidates to it
        return stack.run(user, *args, timeout_s=PROCESS_TIMEOUT_S, **env, **more)

    api = ("--port", str(api_port), "--data-dir", str(tmp_path / "a"))
    runs = [
        ("evsched node:", launch("node", "node", "--data-dir", str(tmp_path / "n"))),
        ("evsched worker:", launch("worker", "worker", "--app", APP)),
        ("error:", launch("api", "api", *api, EVSCHED_API_TOKEN=TOKEN)),
        ("error:", launch("operator", "audit", "some-job", "--data-dir", str(tmp_path / "o"))),
    ]
    finished = await asyncio.gather(*(run for _, run in runs))
    for (prefix, _), ran in zip(runs, finished, strict=True):
        assert ran.code != 0, (prefix, ran)
        line = _one_line_error(ran.err, prefix)
        assert cause in line and "Kafka at" in line, (prefix, line)


async def test_the_librdkafka_event_log_connects_with_the_documented_variables(
    stack: SecureStack,
) -> None:
    """EVSCHED_KAFKA_CLIENT=confluent: the same SASL_SSL variables, translated for librdkafka,
    let the producer role append (with a header) and write an atomic batch; a wrong password is
    a PublishError naming the broker, not a hang."""
    settings = stack.broker.client_settings("producer", stack.namespace)
    events = Topics(stack.namespace).events
    log = RdkafkaEventLog(settings, client_id="evsched-secure-rdkafka")
    try:
        ack = await asyncio.wait_for(
            log.append(events, "job-rd", b"v", (("evsched-proof", b"p"),)), 60
        )
        assert ack.topic == events and ack.log_at is not None
        batch = [Outbound("job-rd-1", b"a"), Outbound("job-rd-2", b"b")]
        assert len(await asyncio.wait_for(log.append_atomic(events, batch), 60)) == 2
    finally:
        await log.close()
    wrong = stack.broker.client_env("producer") | {"EVSCHED_KAFKA_SASL_PASSWORD": "not-it"}
    refused = RdkafkaEventLog(
        Settings.from_env({**wrong, "EVSCHED_NAMESPACE": stack.namespace}),
        client_id="evsched-secure-rdkafka-wrong",
    )
    try:
        with pytest.raises(PublishError, match=stack.broker.bootstrap):
            await asyncio.wait_for(refused.append(events, "job-rd", b"v"), 60)
    finally:
        await refused.close()
