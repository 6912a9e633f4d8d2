"""The ``workflow_ops`` recording (fold version 5): a whole workflow cancelled and requeued by the
operator's ``evsched workflow cancel|requeue``.

A chain of four whose second step dies (its input is not fixed yet): the third step gives up on
it and the fourth on the third; once fixed, ``workflow requeue`` re-runs the dead step and the two
cancelled ones wait again (``JobRequeued.rewait``), each released once more by the new success. A
group of four with a callback, cancelled as a whole while its members run (children first, in one
transaction), cancelled again (nothing), then requeued: the members run and the callback is
released once. A hostile producer's rewaits, each rejected with its reason: of a succeeded job, of
a job that waits on no parent, of an unknown job.
"""

from __future__ import annotations

import asyncio

from replay.scenario_workflows import _folded
from replay.scenarios import produce_raw, until_status
from tests.integration.engine import Operator, Stack, wait_for
from tests.integration.workflow_ops_app import make_app

from evsched.adapters import avro
from evsched.adapters.ids import new_id
from evsched.client import App, chain, group
from evsched.core.events import JobCancelled, JobRequeued, entity_id
from evsched.core.state import Status

APP = "tests.integration.workflow_ops_app:app"


async def workflow_ops(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "5")
    stack.start_worker("worker-1", "--lease-s", "3", "--concurrency", "16", app=APP)
    operator = Operator(stack)
    async with make_app(stack.settings) as app:
        cut = await _chain_fixed_and_requeued(stack, app, operator)
        fan = await _group_cancelled_and_requeued(stack, app, operator)
        root = await app.get_task("s.noop").options(delay=3600).enqueue()
        await app.publish(JobCancelled(event_id=new_id(), job_id=root, emitted_at=0, source="op"))
        await until_status(stack, [root], Status.CANCELLED)
    forged = [
        JobRequeued(event_id=new_id(), job_id=job, emitted_at=0, source="forger", rewait=True)
        for job in (cut[-1], root, "no-such-job")
    ]
    await produce_raw(stack, [(entity_id(e).encode(), avro.encode_event(e)) for e in forged])
    await _folded(stack)
    assert (await stack.job(fan[-1])).status is Status.SUCCEEDED  # type: ignore[union-attr]


async def _chain_fixed_and_requeued(stack: Stack, app: App, operator: Operator) -> list[str]:
    marks = stack.tmp / "chain"
    marks.mkdir()
    plus, fixable = app.get_task("s.plus"), app.get_task("s.plus_when_fixed")
    steps = (plus.s(1, 0), fixable.s(str(marks), 10), plus.s(100, 0), plus.s(1000, 0))
    handle = await app.enqueue_workflow(chain(*steps))
    await until_status(stack, handle.job_ids[3:], Status.CANCELLED)
    await operator.json("workflow", "requeue", handle.job_ids[0], "--dry-run")
    await asyncio.to_thread((marks / "fixed").touch)
    await operator.json("workflow", "requeue", handle.job_ids[0], "--reason", "input fixed")
    await until_status(stack, handle.job_ids, Status.SUCCEEDED)
    return handle.job_ids


async def _group_cancelled_and_requeued(stack: Stack, app: App, operator: Operator) -> list[str]:
    marks = stack.tmp / "group"
    marks.mkdir()
    gated, count = app.get_task("s.gated"), app.get_task("s.count_results")
    members = [gated.s(str(marks), f"m{i}") for i in range(4)]
    handle = await app.enqueue_workflow(group(members, callback=count.s()))

    async def started() -> bool:
        return await asyncio.to_thread(lambda: any(marks.glob("started-*")))

    await wait_for(started, what="a member to start", timeout_s=120)
    await operator.json("workflow", "cancel", handle.last.job_id)
    await until_status(stack, handle.job_ids, Status.CANCELLED)
    await operator.json("workflow", "cancel", handle.last.job_id)  # nothing left to cancel
    await asyncio.to_thread((marks / "go").touch)

    async def settled() -> bool:
        plan = await operator.json("workflow", "requeue", handle.job_ids[0], "--dry-run")
        return len(plan["would_requeue"]) == len(handle.job_ids)

    await wait_for(settled, what="every member's cancel to reach the callback", timeout_s=120)
    await operator.json("workflow", "requeue", handle.job_ids[0])
    await until_status(stack, handle.job_ids, Status.SUCCEEDED)
    return handle.job_ids
