"""Declared queues on the real broker (issue 9, D.13): a queue is its dispatch topic; requests
naming other queues are refused and create no topic; an operator declares one with
``evsched kafka topics --queue``."""

from __future__ import annotations

import asyncio
import time

import pytest
import typer
from aiokafka.admin import AIOKafkaAdminClient
from tests.conftest import TEST_EVENT_PARTITIONS
from typer.testing import CliRunner

from evsched.adapters.kafka.queues import KafkaQueues
from evsched.cli.kafka import kafka_app
from evsched.operator import register
from evsched.settings import Settings

pytestmark = [pytest.mark.broker]


async def topics_of(bootstrap: str, namespace: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t for t in await admin.list_topics() if t.startswith(f"{namespace}.")}
    finally:
        await admin.close()


async def test_only_declared_queues_are_known_and_requests_create_no_topic(
    kafka_bootstrap: str, namespace: str
) -> None:
    settings = Settings(
        bootstrap=kafka_bootstrap, namespace=namespace, event_partitions=TEST_EVENT_PARTITIONS
    )
    queues = KafkaQueues(settings, refresh_s=0.2)
    before = await topics_of(kafka_bootstrap, namespace)
    assert await queues.declared("default")
    for i in range(50):
        assert not await queues.declared(f"made-up-{i}")
    assert not await queues.declared("bad queue!")
    assert await topics_of(kafka_bootstrap, namespace) == before

    env = {
        "EVSCHED_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "EVSCHED_NAMESPACE": namespace,
        "EVSCHED_EVENT_PARTITIONS": str(TEST_EVENT_PARTITIONS),
    }
    app = typer.Typer()
    register(app)
    refused = await asyncio.to_thread(
        CliRunner().invoke, app, ["enqueue", "t.x", "--queue", "fresh", "--no-wait"], env=env
    )
    assert refused.exit_code == 2, refused.output
    assert "queue 'fresh' is not declared" in refused.output
    assert "Traceback" not in refused.output
    assert await topics_of(kafka_bootstrap, namespace) == before

    made = await asyncio.to_thread(
        CliRunner().invoke, kafka_app, ["topics", "--queue", "fresh"], env=env
    )
    assert made.exit_code == 0, made.output
    deadline = time.monotonic() + 30
    while not await queues.declared("fresh"):
        assert time.monotonic() < deadline, "a declared queue stays unknown"
        await asyncio.sleep(0.1)
    accepted = await asyncio.to_thread(
        CliRunner().invoke, app, ["enqueue", "t.x", "--queue", "fresh", "--no-wait"], env=env
    )
    assert accepted.exit_code == 0, accepted.output
    assert await queues.names() == ["default", "fresh"]  # the dispatch topics, by queue name
