"""examples/outbox_fastapi.py run as docs/outbox.md tells a newcomer to run it: uvicorn serving
the example, ``evsched relay``, a node and a worker of ``examples.app``; an order placed over HTTP
gets its receipt job run once, and an order whose transaction rolls back leaves no job."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import psycopg
import pytest
from tests.conftest import unique_name
from tests.integration.engine import REPO, Stack, wait_for
from tests.integration.outbox_rig import rows, start_relay, until_drained

from evsched.adapters.kafka.topics import ensure_topics
from evsched.core.events import JobEnqueued
from evsched.core.invariants import replay
from evsched.core.state import Status, Verdict
from evsched.devstack.process import free_port

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(240)]


async def test_the_example_places_an_order_whose_receipt_runs_once_and_a_failed_one_leaves_none(
    kafka_bootstrap: str, postgres_dsn: str, tmp_path: Path
) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # a fresh database of its own
        database = f"shop_{os.urandom(4).hex()}"
        conn.execute(f'CREATE DATABASE "{database}"')
    dsn = postgres_dsn.rsplit("/", 1)[0] + f"/{database}"
    namespace = unique_name("obx")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    stack = Stack(kafka_bootstrap, namespace, tmp_path)
    try:
        stack.start_node("node-1")
        stack.start_worker("worker-1", app="examples.app:app")  # what `evsched dev` runs
        port = free_port()
        server = _serve_example({**stack.env(), "EVSCHED_OUTBOX_DSN": dsn}, port, tmp_path)
        relay = start_relay(tmp_path, dsn, stack.settings, "evsched_outbox")
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                await wait_for(lambda: _answers(http), what="the example serving")
                placed = await http.post(
                    "/orders", json={"email": "ada@example.com", "amount_cents": 1200}
                )
                assert placed.status_code == 201, placed.text
                failed = await http.post(
                    "/orders",
                    json={"email": "bob@example.com", "amount_cents": 5, "fail_after_insert": True},
                )
                assert failed.status_code == 500, failed.text
                refused = await http.post("/orders", json={"email": "c@d.e", "amount_cents": 0})
                assert refused.status_code == 422 and "amount_cents" in refused.text
            job_id = placed.json()["job_id"]
            await stack.wait_status(job_id, Status.SUCCEEDED, timeout_s=90)
        finally:
            relay.stop()
            server.terminate()
            server.wait(timeout=30)
        await until_drained(dsn, "evsched_outbox")
        events, undecodable = await stack.history()
    finally:
        await stack.close()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT email FROM orders").fetchall() == [("ada@example.com",)]
    assert rows(dsn, "evsched_outbox") == 0
    assert undecodable == []
    enqueued = [e.job_id for e, _ in events if isinstance(e, JobEnqueued)]
    assert enqueued == [job_id], "one job: the committed order's, none for the rolled-back one"
    timeline = replay(events).job_timelines[job_id]
    assert (timeline[0].kind, timeline[0].verdict) == ("JobEnqueued", Verdict.APPLIED)


async def _answers(http: httpx.AsyncClient) -> bool:
    try:
        return (await http.get("/openapi.json")).status_code == 200
    except httpx.TransportError:
        await asyncio.sleep(0.1)
        return False


def _serve_example(env: dict[str, str], port: int, log_dir: Path) -> subprocess.Popen[bytes]:
    """``uvicorn examples.outbox_fastapi:api --port PORT``, as docs/outbox.md shows it."""
    argv = [sys.executable, "-m", "uvicorn", "examples.outbox_fastapi:api", "--port", str(port)]
    with (log_dir / "uvicorn.log").open("wb") as log:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
