"""The fleet as of a moment, on the real broker (issue 34, item 3): jobs run in two phases with a
time T noted between them; ``evsched rebuild --until T`` makes, partition by partition, the same
index (digest) as a rebuild to the last offset appended at or before T, found here from the
records' own log times; ``GET /v1/jobs?as_of=T`` and ``/v1/stats?as_of=T`` answer what that index
holds (first a 202 while the API's index is built, then from its cache), and a point that is
none (in the future, before retention's start) is a 422 naming as_of."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from tests.integration.engine import REPO, Operator, node_and_worker, wait_for

from evsched.adapters.clock import now_ms
from evsched.adapters.index.store import PartitionIndex
from evsched.adapters.kafka.log_cut import AtTime
from evsched.api import create_app
from evsched.api.as_of import RebuiltIndexes
from evsched.client import App
from evsched.core.state import Status
from evsched.operator.rebuild import PartitionPlan, PartitionResult, rebuild_one

pytestmark = [pytest.mark.broker, pytest.mark.slow]

TOKEN = "as-of-integration-token"


async def test_rebuild_until_a_time_and_as_of_answer_the_index_of_the_events_before_it(
    kafka_bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The API's rebuilds run `python -m evsched`: this checkout's code.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), str(REPO)]))
    async with node_and_worker(kafka_bootstrap, tmp_path, "asof") as (stack, _):
        began = now_ms()
        before = await stack.enqueue_effects(6, "before")
        for job in before:
            await stack.wait_status(job, Status.SUCCEEDED)
        at = now_ms()

        async def clock_moved() -> bool:
            return now_ms() > at + 1

        await wait_for(clock_moved, what="the clock to pass T")  # phase 2 is appended after T
        after = await stack.enqueue_effects(4, "after")
        for job in after:
            await stack.wait_status(job, Status.SUCCEEDED)

        # The reference: each partition rebuilt to its last record appended at or before T,
        # found from the records' log times (not from the broker's offsets-for-times lookup).
        records = await stack.read_topic(stack.topics.events)
        last = dict.fromkeys(range(stack.partitions), -1)
        for record in records:
            if record.log_at <= at:
                last[record.partition] = max(last[record.partition], record.offset)
        assert any(r.log_at > at for r in records)
        reference = {
            p: await asyncio.to_thread(rebuild_one, _plan(stack, p, until, tmp_path / "ref"))
            for p, until in last.items()
        }
        jobs = _jobs(tmp_path / "ref", stack.partitions)
        assert jobs == {job: "succeeded" for job in before}  # phase 1 only, as it ended

        operator = Operator(stack)
        document = await operator.json(
            "rebuild", "--until", str(AtTime(at)), "--data-dir", str(tmp_path / "cli"),
            "--processes", "1",
        )  # fmt: skip
        assert document["until"] == str(AtTime(at))
        assert {p["partition"]: (p["until"], p["applied_offset"], p["digest"]) for p in
                document["partitions"]} == _expected(last, reference)  # fmt: skip
        code, output = await operator.run(
            "rebuild", "--until", str(AtTime(now_ms() + 60_000)), "--data-dir", str(tmp_path / "x")
        )
        assert code == 2 and "--until" in output and "in the future" in output, output

        client = App(stack.settings, name="as-of-test")
        past = RebuiltIndexes(stack.settings, root=tmp_path / "api-as-of")
        api = create_app(
            stack.settings,
            replica=await stack.replica(),
            app=client,
            token=TOKEN,
            past=past,
            as_of_wait_s=0.01,
        )
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=api), base_url="http://api")
        try:
            await _check_api(http, at, last, reference, jobs)
            # Before retention's start: partition 0's first record is deleted.
            await stack.trim({0: 1})
            response = await http.get("/v1/stats", params={"as_of": str(AtTime(began - 1))})
            assert response.status_code == 422, response.text
            assert response.json()["error"]["field"] == "as_of"
            assert "before the retention start of partition 0" in response.text
        finally:
            await http.aclose()
            await api.state.evsched_dashboard.facts.close()
            await past.close()
            await client.close()


async def _check_api(
    http: httpx.AsyncClient,
    at: int,
    last: dict[int, int],
    reference: dict[int, PartitionResult],
    jobs: dict[str, str],
) -> None:
    as_of = str(AtTime(at))
    first = await http.get("/v1/stats", params={"as_of": as_of})
    assert first.status_code == 202, first.text  # the index is being built
    assert first.json()["as_of"]["offsets"] == {str(p): o for p, o in last.items()}
    stats = await _answer(http, "/v1/stats", {"as_of": as_of})
    assert stats["total"] == len(jobs)
    assert stats["by_status"]["succeeded"] == len(jobs)
    assert stats["partitions"] == [
        {"partition": p, "applied_offset": r.applied_offset} for p, r in reference.items()
    ]
    listed: dict[str, str] = {}
    params: dict[str, Any] = {"as_of": as_of, "limit": 4}
    while True:
        page = await _answer(http, "/v1/jobs", params)
        listed.update({j["id"]: j["status"] for j in page["jobs"]})
        if page["next_cursor"] is None:
            break
        params["cursor"] = page["next_cursor"]
    assert listed == jobs
    # The same offsets named: the same cached index, answered at once.
    named = ",".join(f"{p}:{o}" for p, o in last.items())
    again = await http.get("/v1/stats", params={"as_of": named})
    assert again.status_code == 200 and again.json()["total"] == len(jobs), again.text
    now = (await http.get("/v1/stats")).json()
    assert now["total"] == len(jobs) + 4
    future = await http.get("/v1/jobs", params={"as_of": str(AtTime(now_ms() + 60_000))})
    assert future.status_code == 422 and future.json()["error"]["field"] == "as_of"


async def _answer(http: httpx.AsyncClient, path: str, params: dict[str, Any]) -> Any:
    async def probe() -> Any:
        response = await http.get(path, params=params)
        if response.status_code == 202:
            return None
        assert response.status_code == 200, response.text
        return response.json()

    return await wait_for(probe, what=f"{path} as of {params['as_of']}")


def _plan(stack: Any, partition: int, until: int, root: Path) -> PartitionPlan:
    return PartitionPlan(
        bootstrap=stack.bootstrap,
        namespace=stack.namespace,
        partition=partition,
        until=until,
        directory=root / f"p{partition:04d}",
        keyring=stack.keyring,
    )


def _jobs(root: Path, partitions: int) -> dict[str, str]:
    found = {}
    for partition in range(partitions):
        index = PartitionIndex(root / f"p{partition:04d}", partition)
        try:
            found.update({s.job_id: s.status.value for s in index.jobs()})
        finally:
            index.close()
    return found


def _expected(
    last: dict[int, int], reference: dict[int, PartitionResult]
) -> dict[int, tuple[int, int, str]]:
    return {p: (last[p], reference[p].applied_offset, reference[p].digest) for p in last}
