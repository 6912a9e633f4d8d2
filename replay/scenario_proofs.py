"""The ``forged_facts`` recording (fold version 9, issue 32): facts that need a proof of role.

A node and a worker run with the stack's keys. Jobs run first on every partition, so each one
requires proofs from its first proven decision on. A gated job runs; a child waits on it; a job
is parked an hour ahead. A forger (valid Avro, no proof or a made-up one) then writes the
victim's completion with the live token and an effect, its expiry, a lease of the parked job at
2^53 - 1 and one of ten years at its next token, the child's release and its ``dead``, a permit
grant and a permit release: each is ``rejected`` as unproven. The gate opens: the worker's proven
success is applied and releases the child, which runs.
"""

from __future__ import annotations

from replay.scenarios import until_node_past_the_end, until_status
from tests.integration import forgery
from tests.integration.engine import Stack, wait_for

from evsched.core import roles
from evsched.core.events import QueuePermit, entity_id
from evsched.core.state import Status, Verdict


async def forged_facts(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "10")
    stack.start_worker("worker-1")
    marks = stack.tmp / "gate"
    marks.mkdir()
    async with stack.app() as app:
        warm = [await app.enqueue("s.noop") for _ in range(12)]  # every partition's first lease
        await until_status(stack, warm, Status.SUCCEEDED)
        victim = await app.enqueue("s.gated", str(marks), "victim")
        running = await _running(stack, victim)
        child = await app.get_task("s.noop").options(after=[victim]).enqueue()
        parked = await app.get_task("s.noop").options(delay=3600.0).enqueue()
        await until_status(stack, [child], Status.WAITING)
        forged = forgery.forged_facts(victim, running, child, parked)
        await forgery.forge(stack, forged)
        for event in forged:
            if not isinstance(event, QueuePermit):
                await _unproven(stack, entity_id(event), event.event_id)
        (marks / "go").touch()
        await until_status(stack, [victim, child], Status.SUCCEEDED)
        done = await stack.job(victim)
        assert done is not None and done.token == running, done
    await until_node_past_the_end(stack)


async def _running(stack: Stack, job_id: str) -> int:
    state = await stack.wait_status(job_id, Status.RUNNING, timeout_s=240)
    return state.token


async def _unproven(stack: Stack, job_id: str, event_id: str) -> None:
    async def judged() -> bool:
        found = [e for e in await stack.timeline(job_id) if e.event_id == event_id]
        if not found:
            return False
        assert found[0].verdict is Verdict.REJECTED, found[0]
        assert roles.is_unproven(found[0].reason), found[0]
        return True

    await wait_for(judged, what=f"{event_id} rejected as unproven", timeout_s=240)
