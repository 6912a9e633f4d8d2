"""The API's writes during a broker freeze, on a real broker of its own (issue 9, E.16): the shared
broker must never be stopped, so this test starts a private one and freezes it with SIGSTOP.

A write must answer within the bound with the job id and a status saying it is not confirmed
(202 ``unconfirmed``), never hang; once the broker thaws, the write lands and reads find it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.conftest import start_private_broker, unique_name
from tests.integration.engine import wait_for

from evsched.adapters.kafka.queues import FixedQueues
from evsched.adapters.kafka.topics import ensure_topics
from evsched.api import create_app
from evsched.client import App
from evsched.core import ids
from evsched.devstack.process import proc_state
from evsched.runtime.replica import Replica
from evsched.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(600)]

WAIT_S = 3.0
TOKEN = "frozen-broker-write-token"


@pytest.fixture
def private_broker(tmp_path: Path, kafka_bootstrap: str) -> Iterator[tuple[str, int]]:
    """A broker for this test alone: (bootstrap, pid). Needs the jars the session broker uses."""
    broker, status = start_private_broker(tmp_path / "kafka")
    assert status.pid is not None
    try:
        yield status.bootstrap, status.pid
    finally:
        os.kill(status.pid, signal.SIGCONT)  # a stopped JVM ignores SIGTERM until continued
        broker.down()


async def _stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (state T in /proc/<pid>/task/<tid>/stat)."""

    def states() -> list[str]:
        tasks = Path(f"/proc/{pid}/task").glob("*/stat")
        return [state for stat in tasks if (state := proc_state(stat)) is not None]

    found = await asyncio.to_thread(states)
    return bool(found) and all(state in ("T", "t") for state in found)


async def test_writes_during_a_broker_freeze_answer_unconfirmed_within_the_bound(
    private_broker: tuple[str, int], tmp_path: Path
) -> None:
    bootstrap, pid = private_broker
    namespace = unique_name("frz")
    await ensure_topics(bootstrap, namespace, event_partitions=1, queues=["default"])
    settings = Settings(bootstrap=bootstrap, namespace=namespace, event_partitions=1)
    replica = Replica(settings, tmp_path / "replica")
    client = App(settings, name="frozen-test")
    await replica.start()
    app = create_app(
        settings,
        replica=replica,
        app=client,
        token=TOKEN,
        wait_timeout_s=WAIT_S,
        queues=FixedQueues(["default"]),
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
    try:
        warm = await http.post("/v1/jobs", json={"task": "t"}, headers=auth)
        assert warm.status_code == 201, warm.text

        os.kill(pid, signal.SIGSTOP)
        try:
            # A stop reaches each of the JVM's threads in turn: a write sent before the last one
            # stopped could still be acknowledged.
            await wait_for(lambda: _stopped(pid), what=f"every thread of broker {pid} stopped")
            started = time.monotonic()
            frozen = await asyncio.wait_for(
                http.post(
                    "/v1/jobs", json={"task": "t"}, headers={**auth, "Idempotency-Key": "frz-1"}
                ),
                timeout=60,
            )
            took = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        assert frozen.status_code == 202, frozen.text
        assert took < WAIT_S + 2, took
        body = frozen.json()
        assert body["id"] == ids.job_id_for_key("default", "frz-1")
        assert (body["status"], body["partition"], body["offset"]) == ("unconfirmed", None, None)

        deadline = time.monotonic() + 120
        while (await http.get(f"/v1/jobs/{body['id']}")).status_code != 200:
            assert time.monotonic() < deadline, "the unconfirmed write never landed"
            await asyncio.sleep(0.2)
    finally:
        await http.aclose()
        await client.close()
        await replica.stop()
