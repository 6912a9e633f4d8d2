"""Workflows over the HTTP API (in-memory twins, the real fold and index, no node): ``after`` on
enqueue and batch with their 422s, the graph endpoint, and a whole workflow's cancel and requeue.

With no node here, the tests write the parents' resolutions themselves, as a node would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from evsched.core import ids
from evsched.core.bounds import MAX_PARENTS
from evsched.core.events import ChildRegistered, JobEnqueued, JobRequeued, ParentResolved
from tests.unit.api.test_api import enqueue, error_of, kill
from tests.unit.api.test_api_twin import Harness


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Harness]:
    async with Harness(tmp_path) as harness:
        yield harness


async def resolve(api: Harness, child: str, parent: str, outcome: str) -> None:
    """The resolution a parent's node sends for the parent's end (the last record of it)."""
    offset = max(r.offset for r in api.log.records if r.key == parent)
    await api.replica.append(
        ParentResolved(
            event_id=f"r-{child}-{parent}-{offset}", job_id=child, emitted_at=0, source="node-x",
            parent_id=parent, outcome=outcome, parent_partition=0, parent_offset=offset,
        )
    )  # fmt: skip


async def graph(api: Harness, job_id: str, **params: Any) -> dict[str, Any]:
    response = await api.http.get(f"/v1/jobs/{job_id}/workflow", params=params)
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


# --- after on enqueue ---------------------------------------------------------------------------


async def test_an_enqueue_with_after_waits_and_registers_with_its_parents(api: Harness) -> None:
    parent = await enqueue(api)
    child = await enqueue(api, after=[parent["id"]], after_rule="all_finished",
                          results_to_args="append")  # fmt: skip
    assert child["status"] == "waiting"
    assert (child["after"], child["after_rule"]) == ([parent["id"]], "all_finished")
    enqueued, registered = api.log.events()[1:]
    assert isinstance(enqueued, JobEnqueued) and enqueued.results_to_args == "append"
    assert isinstance(registered, ChildRegistered)
    assert (registered.job_id, registered.child_id) == (parent["id"], child["id"])


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"after": ["a"], "after_rule": "some_succeeded"}, "after_rule", "all_succeeded"),
        ({"after": [f"p{i}" for i in range(MAX_PARENTS + 1)]}, "after", "at most"),
        ({"after": [""]}, "after.0", "at least 1"),
        ({"after": ["\N{GRINNING FACE}" * 300]}, "after.0", "UTF-8 bytes"),
        ({"after": ["a", "a"]}, "after", "twice"),
        ({"after_rule": "all_finished"}, "after_rule", "only for a job with after"),
        ({"results_to_args": "list"}, "results_to_args", "only for a job with after"),
        ({"after": ["a"], "results_to_args": "first"}, "results_to_args", "append"),
    ],
)
async def test_workflow_fields_are_validated_naming_the_field(
    api: Harness, body: dict[str, Any], field: str, words: str
) -> None:
    response = await api.http.post("/v1/jobs", json={"task": "t.run", **body})
    assert response.status_code == 422, response.text
    problem = error_of(response)
    assert problem["field"] == field and words in response.text, problem
    assert api.log.events() == []


async def test_a_job_may_not_wait_on_itself(api: Harness) -> None:
    own = ids.job_id_for_key("default", "k-1")
    response = await api.http.post(
        "/v1/jobs", json={"task": "t.run", "after": [own]}, headers={"Idempotency-Key": "k-1"}
    )
    assert response.status_code == 422
    assert error_of(response)["field"] == "after"
    assert "itself" in error_of(response)["message"]


async def test_a_batch_with_after_is_atomic_or_refused(api: Harness) -> None:
    parent = await enqueue(api)
    jobs = [{"task": "t.run", "after": [parent["id"]]}, {"task": "t.run"}]
    loose = (await api.http.post("/v1/jobs:batch", json={"jobs": jobs})).json()
    assert [r["outcome"] for r in loose["results"]] == ["invalid", "accepted"]
    assert loose["results"][0]["field"] == "after"
    body = {"jobs": [*jobs, {"task": "t.run", "after": ["x"], "after_rule": "nope"}]}
    refused = await api.http.post("/v1/jobs:batch", json={**body, "atomic": True})
    assert refused.status_code == 422 and error_of(refused)["field"] == "jobs.2.after_rule"
    together = (await api.http.post("/v1/jobs:batch", json={"jobs": jobs, "atomic": True})).json()
    assert [r["outcome"] for r in together["results"]] == ["accepted", "accepted"]
    child = together["results"][0]["job_id"]
    assert (await api.http.get(f"/v1/jobs/{child}")).json()["status"] == "waiting"
    assert (await graph(api, parent["id"]))["counts"] == {"scheduled": 1, "waiting": 1}


@pytest.mark.parametrize("atomic", [True, False])
async def test_a_batch_whose_jobs_wait_on_one_another_is_refused_naming_them(
    api: Harness, atomic: bool
) -> None:
    a, b, c = (ids.job_id_for_key("default", key) for key in ("a", "b", "c"))
    jobs = [
        {"task": "t.run", "idempotency_key": "a", "after": [c]},
        {"task": "t.run", "idempotency_key": "b", "after": [a]},
        {"task": "t.run", "idempotency_key": "c", "after": [b]},
        {"task": "t.run"},
    ]
    response = await api.http.post("/v1/jobs:batch", json={"jobs": jobs, "atomic": atomic})
    assert response.status_code == 422
    problem = error_of(response)
    assert problem["field"] == "after"
    assert f"cycle, so none would ever run: {a} -> {c} -> {b} -> {a}" in problem["message"]
    assert api.log.events() == []


# --- the graph ----------------------------------------------------------------------------------


async def test_the_graph_of_a_chain_with_its_resolutions(api: Harness) -> None:
    a = await enqueue(api)
    b = await enqueue(api, after=[a["id"]])
    c = await enqueue(api, after=[b["id"]])
    await kill(api, a["id"])
    await resolve(api, b["id"], a["id"], "dead")
    found = await graph(api, c["id"])
    assert [n["id"] for n in found["nodes"]] == [a["id"], b["id"], c["id"]]
    assert (found["root"], found["truncated"], found["node_limit"]) == (c["id"], False, 2000)
    node = found["nodes"][1]
    assert (node["status"], node["rule"], node["decision"]) == ("cancelled", "all_succeeded",
                                                                  "gave_up")  # fmt: skip
    [link] = node["parents"]
    assert link["id"] == a["id"] and link["outcome"] == "dead" and link["partition"] == 0
    assert node["decided_by"] == link
    assert found["nodes"][2]["parents"] == [
        {"id": b["id"], "outcome": None, "partition": None, "offset": None}
    ]
    cut = await graph(api, c["id"], limit=2)
    assert cut["truncated"] and len(cut["nodes"]) == 2


async def test_the_graph_of_an_unknown_job_is_a_404_and_limits_are_checked(api: Harness) -> None:
    response = await api.http.get("/v1/jobs/nope/workflow")
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"
    job = await enqueue(api)
    response = await api.http.get(f"/v1/jobs/{job['id']}/workflow", params={"limit": 0})
    assert response.status_code == 422 and error_of(response)["field"] == "limit"


# --- cancel and requeue -------------------------------------------------------------------------


async def test_cancel_a_group_with_its_callback_then_again(api: Harness) -> None:
    members = [await enqueue(api) for _ in range(3)]
    callback = await enqueue(api, after=[m["id"] for m in members], results_to_args="list")
    await kill(api, members[0]["id"])
    response = await api.http.post(f"/v1/jobs/{callback['id']}/workflow/cancel",
                                   json={"reason": "stop"})  # fmt: skip
    assert response.status_code == 200, response.text
    done = response.json()
    assert (done["cancelled"], done["already_finished"], done["missing"]) == (3, 1, [])
    assert done["jobs"][0]["id"] == callback["id"]  # children first
    assert {j["verdict"] for j in done["jobs"]} == {"applied"}
    timeline = (await api.http.get(f"/v1/jobs/{callback['id']}/timeline")).json()["events"]
    assert timeline[-1]["reason"] == (
        f"cancelled by api: workflow cancel (of {callback['id']}): stop"
    )
    again = (await api.http.post(f"/v1/jobs/{members[1]['id']}/workflow/cancel")).json()
    assert (again["cancelled"], again["already_finished"], again["jobs"]) == (0, 4, [])


async def test_requeue_a_chain_cut_by_a_dead_parent(api: Harness) -> None:
    a = await enqueue(api)
    b = await enqueue(api, after=[a["id"]])
    await kill(api, a["id"])
    path = f"/v1/jobs/{b['id']}/workflow/requeue"
    settling = await api.http.post(path)
    assert settling.status_code == 409 and error_of(settling)["code"] == "workflow_settling"
    await resolve(api, b["id"], a["id"], "dead")
    dry = (await api.http.post(path, json={"dry_run": True})).json()
    assert (dry["dry_run"], dry["would_requeue"], dry["would_rewait"], dry["requeued"]) == (
        True, 2, 1, 0,
    )  # fmt: skip
    assert [(j["id"], j["how"]) for j in dry["jobs"]] == [(a["id"], "requeue"), (b["id"], "rewait")]
    done = (await api.http.post(path, json={"reason": "fixed"})).json()
    assert (done["requeued"], done["rewaited"]) == (2, 1)
    assert {j["verdict"] for j in done["jobs"]} == {"applied"}
    states = {n["id"]: n["status"] for n in (await graph(api, a["id"]))["nodes"]}
    assert states == {a["id"]: "scheduled", b["id"]: "waiting"}
    rewait = [e for e in api.log.events() if isinstance(e, JobRequeued) and e.rewait]
    assert [e.job_id for e in rewait] == [b["id"]]
    nothing = (await api.http.post(path)).json()
    assert (nothing["requeued"], nothing["would_requeue"]) == (0, 0)
