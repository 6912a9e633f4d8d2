"""A workflow's operator surface on the real broker: a real node and worker, three partitions.

``evsched workflow requeue`` re-runs a chain's dead middle step and the tail, cancelled because
of it, waits again and completes, each child released once per wait; ``workflow cancel`` stops a
group and its callback at once, and again cancels nothing; the API's graph and ``evsched
workflow`` name the parent's record that released a child. Each test ends with the whole log
checked (I1/I6/I7 and I8).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from tests.conftest import unique_name
from tests.integration.engine import Operator, Stack, wait_for
from tests.integration.workflow_ops_app import make_app

from evsched.adapters.kafka.topics import ensure_topics
from evsched.api import create_app
from evsched.client import App, chain, group
from evsched.core.state import Status, TimelineEntry, Verdict
from evsched.runtime.replica import Replica

pytestmark = [
    pytest.mark.broker,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
]

APP = "tests.integration.workflow_ops_app:app"
# Generous: on a loaded machine a node takes tens of seconds to start and rebalance.
WAIT_S = 240.0
TOKEN = "wfops-write-token-0001"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stack(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    namespace = unique_name("wfops")
    await ensure_topics(kafka_bootstrap, namespace, event_partitions=3, queues=["default"])
    engine = Stack(kafka_bootstrap, namespace, tmp_path_factory.mktemp("wfops"))
    engine.start_node("node-1", "--dispatch-timeout-s", "5")
    engine.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16", app=APP)
    try:
        yield engine
    finally:
        await engine.close()


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def checked(stack: Stack) -> AsyncIterator[None]:
    yield
    await stack.check(all_terminal=False)


def applied(entries: list[TimelineEntry], kind: str) -> list[TimelineEntry]:
    return [e for e in entries if e.kind == kind and e.verdict is Verdict.APPLIED]


def end_of(entries: list[TimelineEntry]) -> str:
    """``p1@23``: where the job's (last) applied success is."""
    [*_, end] = applied(entries, "AttemptSucceeded")
    return f"p{end.partition}@{end.offset}"


async def test_requeue_reruns_the_dead_middle_and_the_tail_completes_once(
    stack: Stack, tmp_path: Path
) -> None:
    operator = Operator(stack)
    async with make_app(stack.settings) as app:
        plus, fixable = app.get_task("s.plus"), app.get_task("s.plus_when_fixed")
        steps = (plus.s(1, 0), fixable.s(str(tmp_path), 10), plus.s(100, 0), plus.s(1000, 0))
        handle = await app.enqueue_workflow(chain(*steps))
    a, b, c, d = handle.job_ids
    await stack.wait_status(b, Status.DEAD, timeout_s=WAIT_S)
    await stack.wait_status(d, Status.CANCELLED, timeout_s=WAIT_S)  # c gave up on b, then d on c
    dry = await operator.json("workflow", "requeue", a, "--dry-run")
    assert dry["would_requeue"] == [
        {"id": b, "how": "requeue"},
        {"id": c, "how": "rewait"},
        {"id": d, "how": "rewait"},
    ]
    assert (await stack.job(c)).status is Status.CANCELLED  # type: ignore[union-attr]
    (tmp_path / "fixed").touch()
    done = await operator.json("workflow", "requeue", d, "--reason", "fixed the input")
    assert sorted(done["requeued"]) == sorted([b, c, d]) and done["rewaited"] == 2
    final = await stack.wait_status(d, Status.SUCCEEDED, Status.DEAD, timeout_s=WAIT_S)
    assert final.status is Status.SUCCEEDED and json.loads(final.result or b"") == 1111
    waits = ((c, b, ["dead", "succeeded"]), (d, c, ["cancelled", "succeeded"]))
    for child, parent, outcomes in waits:
        timeline = await stack.timeline(child)
        resolutions = applied(timeline, "ParentResolved")
        assert [e.reason.split(" ")[2] for e in resolutions] == outcomes, resolutions
        assert all(parent in e.reason for e in resolutions)
        assert len(applied(timeline, "JobLeased")) == 1  # ran once, after its second release
    again = await operator.json("workflow", "requeue", a)
    assert again == {"root": a, "would_requeue": [], "skipped": []}
    readings = [e["reading"] for e in (await operator.json("audit", c))["events"]]
    released = f"parent {b} succeeded (its record at {end_of(await stack.timeline(b))}"
    assert any(r.startswith(released) and r.endswith("released by it, rule all_succeeded met")
               for r in readings), readings  # fmt: skip
    assert any("to wait again on 1 of its parents: workflow requeue" in r for r in readings)
    await stack.check(all_terminal=True)


async def test_cancel_a_group_with_its_callback_then_again(stack: Stack, tmp_path: Path) -> None:
    operator = Operator(stack)
    async with make_app(stack.settings) as app:
        gated, total = app.get_task("s.gated"), app.get_task("s.total")
        members = [gated.s(str(tmp_path), f"m{i}") for i in range(6)]
        handle = await app.enqueue_workflow(group(members, callback=total.s()))
    *jobs, callback = handle.job_ids
    await stack.wait_status(jobs[0], Status.RUNNING, Status.LEASED, timeout_s=WAIT_S)
    done = await operator.json("workflow", "cancel", jobs[0], "--reason", "not needed")
    assert sorted(done["cancelled"]) == sorted(handle.job_ids)
    assert (done["already_finished"], done["missing"]) == (0, [])
    for job in handle.job_ids:
        await stack.wait_status(job, Status.CANCELLED, timeout_s=WAIT_S)
    again = await operator.json("workflow", "cancel", callback)
    assert (again["cancelled"], again["already_finished"]) == ([], 7)
    timeline = await stack.timeline(callback)
    [cancelled] = applied(timeline, "JobCancelled")
    assert cancelled.reason == f"cancelled by client: workflow cancel (of {jobs[0]}): not needed"
    assert applied(timeline, "JobLeased") == []  # cancelled before any member's end reached it
    (tmp_path / "go").touch()  # lets a handler the cancel did not reach finish (rejected)
    await stack.check(all_terminal=True)


@pytest_asyncio.fixture(loop_scope="module")
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    replica = Replica(stack.settings, stack.tmp / "api-replica")
    client = App(stack.settings, name="wfops-api")
    await replica.start()
    api = create_app(stack.settings, replica=replica, app=client, token=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    transport = httpx.ASGITransport(app=api)
    async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=headers) as h:
        try:
            yield h
        finally:
            await client.close()
            await replica.stop()


async def test_the_api_graph_and_the_cli_name_the_record_that_released_a_child(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    parent = (await http.post("/v1/jobs", json={"task": "s.plus", "args": [1, 0]})).json()
    body = {"task": "s.plus", "args": [10, 0], "after": [parent["id"]], "results_to_args": "append"}
    response = await http.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    child = response.json()
    assert child["status"] in ("waiting", "scheduled")
    await stack.wait_status(child["id"], Status.SUCCEEDED, timeout_s=WAIT_S)
    assert json.loads((await stack.job(child["id"])).result or b"") == 11  # type: ignore[union-attr]

    async def graph() -> dict[str, object]:
        found = (await http.get(f"/v1/jobs/{child['id']}/workflow")).json()
        return found if found["counts"] == {"succeeded": 2} else {}

    found = await wait_for(graph, what="the API's replica to fold both ends", timeout_s=WAIT_S)
    nodes = found["nodes"]
    assert [n["id"] for n in nodes] == [parent["id"], child["id"]]  # type: ignore[index]
    decided = nodes[1]["decided_by"]  # type: ignore[index]
    released = f"p{decided['partition']}@{decided['offset']}"
    # The parent's success, or, when the parent had ended before the child's registration was
    # folded, the registration, answered at once at its own position.
    timeline = await stack.timeline(parent["id"])
    ends = [*applied(timeline, "AttemptSucceeded"), *applied(timeline, "ChildRegistered")]
    assert released in {f"p{e.partition}@{e.offset}" for e in ends}
    code, text = await Operator(stack).run("workflow", child["id"])
    assert code == 0, text
    assert f"released by {released} ({parent['id']} succeeded)" in " ".join(text.split())
