"""The relay across a broker outage (issue 36): the broker down for 30 s while committed rows
accumulate in the outbox, then drained once it is back, each job exactly once.

The shared broker must never be stopped, so this test stops and restarts a private one (same data
dir and ports, as an operator's restart would).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.conftest import start_private_broker, unique_name
from tests.integration.engine import wait_for
from tests.integration.outbox_rig import (
    commit_orders,
    fresh_table,
    judged_once_all_there,
    outbox_app,
    rows,
    start_relay,
    until_drained,
)

from evsched.adapters.kafka.topics import ensure_topics
from evsched.devstack.broker import LocalBroker
from evsched.outbox import Outbox
from evsched.settings import Settings

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(400)]

OUTAGE_S = 30.0


@pytest.fixture
def private_broker(tmp_path: Path, kafka_bootstrap: str) -> Iterator[LocalBroker]:
    """A broker for this test alone (it needs the jars the session broker uses)."""
    broker, _ = start_private_broker(tmp_path / "kafka")
    try:
        yield broker
    finally:
        broker.down()


async def test_rows_committed_while_the_broker_is_down_are_relayed_once_it_is_back(
    private_broker: LocalBroker, postgres_dsn: str, tmp_path: Path
) -> None:
    namespace = unique_name("obo")
    bootstrap = private_broker.bootstrap
    await ensure_topics(bootstrap, namespace, event_partitions=3, queues=["default"])
    settings = Settings(bootstrap=bootstrap, namespace=namespace, event_partitions=3)
    table = fresh_table(postgres_dsn)
    app = outbox_app(settings)
    outbox = Outbox(table)
    relay = start_relay(tmp_path, postgres_dsn, settings, table, batch_size=50)
    try:
        job_ids = commit_orders(postgres_dsn, outbox, app, [f"up-{n}" for n in range(50)])
        await until_drained(postgres_dsn, table)

        await asyncio.to_thread(private_broker.down)
        down_at = time.monotonic()
        waves = 0
        while time.monotonic() - down_at < OUTAGE_S:  # an application that keeps taking orders
            keys = [f"down-{waves}-{n}" for n in range(20)]
            job_ids += await asyncio.to_thread(commit_orders, postgres_dsn, outbox, app, keys)
            waves += 1
            assert rows(postgres_dsn, table) == 20 * waves, "none leaves while it is down"
            await asyncio.sleep(1.0)  # the application's pace, not a wait for a condition
        assert relay.proc.poll() is None, relay.lines()

        await asyncio.to_thread(private_broker.up)
        await until_drained(postgres_dsn, table, timeout_s=120)
        verdicts = await wait_for(
            lambda: judged_once_all_there(settings, len(job_ids)),
            what="every job in the log",
            timeout_s=60,
        )
        verdicts.assert_exactly_once(job_ids)
        assert relay.proc.poll() is None, "the relay rode the outage out: " + relay.lines()
    finally:
        relay.stop()
