"""Batches take turns with single enqueues (issue 32: a single ``POST /v1/jobs`` took 21 s beside
eight concurrent 1,000-job batches): a batch yields to the event loop while it builds and
judges its jobs, and at most ``MAX_BATCHES_IN_FLIGHT`` batches are written at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from evsched.api import batch
from evsched.api.context import MAX_BATCHES_IN_FLIGHT
from tests.unit.api.test_api_twin import Harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    # The default wait for verdicts: a loaded box judges 1,000 jobs in seconds, and a shorter
    # wait answers 202 (not yet known) where these tests read the verdicts.
    async with Harness(tmp_path, wait_timeout_s=10.0) as harness:
        yield harness


class Ticker:
    """Counts the event loop's turns it gets: none while a handler holds the loop."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._task.cancel()


async def test_a_batch_lets_the_loop_run_while_it_builds_and_judges(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticker = Ticker()
    seen: dict[str, list[int]] = {"built": [], "judged": []}
    event, judged = batch._event, batch._judged

    async def counted_event(*args: Any) -> Any:
        seen["built"].append(ticker.ticks)
        return await event(*args)

    async def counted_judged(*args: Any) -> Any:
        seen["judged"].append(ticker.ticks)
        return await judged(*args)

    monkeypatch.setattr(batch, "_event", counted_event)
    monkeypatch.setattr(batch, "_judged", counted_judged)
    jobs = [{"task": "t.run", "args": [n]} for n in range(1_000)]
    response = await api.http.post("/v1/jobs:batch", json={"jobs": jobs})
    ticker.stop()
    assert response.status_code == 200, response.text
    assert [r["outcome"] for r in response.json()["results"]] == ["accepted"] * 1_000
    for phase, ticks in seen.items():
        assert len(ticks) == 1_000
        # At least one turn for the rest of the loop every CHUNK jobs, in each phase.
        turns = ticks[-1] - ticks[0]
        assert turns >= 1_000 // batch.CHUNK - 1, f"{phase}: {turns} turns in 1,000 jobs"


async def test_a_single_enqueue_is_answered_before_a_large_batch(
    api: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    judging = asyncio.Event()
    judged = batch._judged

    async def noting_judged(*args: Any) -> Any:
        judging.set()
        return await judged(*args)

    monkeypatch.setattr(batch, "_judged", noting_judged)
    answered: list[str] = []

    async def post(name: str, path: str, body: object) -> None:
        response = await api.http.post(path, json=body)
        assert response.status_code in {200, 201}, response.text
        answered.append(name)

    jobs = [{"task": "t.run", "args": [n]} for n in range(1_000)]
    big = asyncio.ensure_future(post("batch", "/v1/jobs:batch", {"jobs": jobs}))
    # The batch is written; its handler reads back 1,000 verdicts from the replica.
    await asyncio.wait_for(judging.wait(), 10)
    await asyncio.wait_for(asyncio.gather(big, post("single", "/v1/jobs", {"task": "t.one"})), 30)
    assert answered == ["single", "batch"]


async def test_batches_past_the_ones_in_flight_wait_then_get_a_503(api: Harness) -> None:
    gate = api.api.state.evsched.batches
    for _ in range(MAX_BATCHES_IN_FLIGHT):
        await gate.acquire()  # as many batches as may be written at once, still being written
    try:
        refused = await api.http.post("/v1/jobs:batch", json={"jobs": [{"task": "t.run"}]})
        # A single enqueue never waits for batches.
        single = await api.http.post("/v1/jobs", json={"task": "t.one"})
    finally:
        for _ in range(MAX_BATCHES_IN_FLIGHT):
            gate.release()
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "busy"
    assert single.status_code == 201, single.text
    accepted = await api.http.post("/v1/jobs:batch", json={"jobs": [{"task": "t.run"}]})
    assert accepted.status_code == 200, accepted.text
