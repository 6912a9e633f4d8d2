"""The dashboard's totals on the real broker and real node and worker processes: an API restarted
over its kept data dir, and a new API whose replica is restored from the ``<ns>.state`` changelog
(the events log trimmed first, so nothing else could give them), show the lifetime totals the
API that watched the jobs run showed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.conftest import unique_name
from tests.integration.engine import Stack, logged, wait_for

from evsched.adapters.kafka.topics import ensure_topics
from evsched.api import create_app
from evsched.client import App
from evsched.core import tallies
from evsched.metrics import Metrics
from evsched.runtime.replica import Replica

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(900)]
# Node and worker processes start slowly on a loaded machine: generous deadlines.
DEADLINE_S = 240.0
PARTITIONS = 2
FAILING, SUCCEEDING = 8, 8


@asynccontextmanager
async def api_over(
    stack: Stack, data_dir: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, Replica]]:
    """The API in process over a replica keeping its indexes in ``data_dir``, as ``evsched api``."""
    metrics = Metrics()
    replica = Replica(stack.settings, data_dir, on_commit=metrics.observe_commit)
    client = App(stack.settings, name="totals-test")
    await replica.start()
    app = create_app(stack.settings, replica=replica, app=client, metrics=metrics)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
    try:
        yield http, replica
    finally:
        await http.aclose()
        await app.state.evsched_dashboard.facts.close()
        await client.close()
        await replica.stop()


async def totals_of(http: httpx.AsyncClient) -> dict[str, int]:
    response = await http.get("/overview.json")
    assert response.status_code == 200, response.text
    found: dict[str, int] = response.json()["totals"]
    return found


def reached(expected: dict[str, int]) -> Any:
    async def probe(http: httpx.AsyncClient) -> dict[str, int] | None:
        found = await totals_of(http)
        return found if all(found[k] == n for k, n in expected.items()) else None

    return probe


async def test_totals_outlive_an_api_restart_and_a_restore_from_the_changelog(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    namespace = unique_name("dashtotals")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=PARTITIONS, queues=["default"])
    stack = Stack(kafka_bootstrap, namespace, tmp_path, partitions=PARTITIONS)
    try:
        node = stack.start_node("node-1")
        stack.start_worker("worker-1")
        async with stack.app() as app:
            failing = app.get_task("s.always_fail")  # 2 attempts: a retry, then dead
            ids = [await failing.enqueue() for _ in range(FAILING)]
        ids += await stack.enqueue_effects(SUCCEEDING, "totals")
        expected = {
            tallies.RETRIES: FAILING,
            tallies.DEAD_LETTERS: FAILING,
            tallies.SUCCEEDED: SUCCEEDING,
            tallies.STALE_COMPLETIONS: 0,
            tallies.CANCELLED: 0,
            tallies.UNDECODABLE: 0,
        }
        async with api_over(stack, tmp_path / "api") as (http, _):
            watched = await wait_for(
                lambda: reached(expected)(http), what="the totals", timeout_s=DEADLINE_S
            )
            page = (await http.get("/")).text
            assert f'id="total-retries">{FAILING}<' in page
            assert f'id="total-dead_letters">{FAILING}<' in page
        assert node.stop() == 0  # a clean stop: the changelog holds every index change

        # The same data dir under a new API: the totals are in its indexes, not in memory.
        async with api_over(stack, tmp_path / "api") as (http, _):
            assert await totals_of(http) == watched

        # Everything the node group committed goes: only the changelog can bring those jobs back.
        committed = {p: await stack.node_committed(p) or 0 for p in range(PARTITIONS)}
        assert all(offset > 0 for offset in committed.values()), committed
        await stack.trim(committed)
        async with api_over(stack, tmp_path / "fresh-api") as (http, replica):
            assert replica.failing == {}
            assert all([await replica.job(job_id) is not None for job_id in ids])  # restored
            assert await totals_of(http) == watched
        assert not logged(node, "partition_index_rebuild_refused")
    finally:
        await stack.close()
