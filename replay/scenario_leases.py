"""The ``forged_leases`` recording (fold version 8, issue 32): a lease applies only at the job's
token + 1. A job is enqueued due at once while no node runs; a forger's ``JobLeased`` at
2^53 - 1 (the largest token) and at its token + 2 come next, each ``rejected`` naming token 1.
Then the node starts, leases the job at token 1, and a worker starts it and succeeds.
"""

from __future__ import annotations

from replay.scenarios import produce_raw, until_node_past_the_end, until_status
from tests.integration.engine import Stack, wait_for

from evsched.adapters import avro
from evsched.core.bounds import MAX_TOKEN
from evsched.core.events import JobLeased
from evsched.core.state import Status, Verdict

WAIT_S = 240.0


async def forged_leases(stack: Stack) -> None:
    stack.start_worker("worker-1", "--lease-s", "3")
    async with stack.app() as app:
        victim = await app.get_task("s.effect").enqueue("victim")  # due now; no node yet
        await produce_raw(stack, _forged(victim, current=0))

        async def judged() -> bool:
            return len(await stack.timeline(victim)) >= 3

        await wait_for(judged, what="the forged leases folded", timeout_s=WAIT_S)
        stack.start_node("node-1", "--dispatch-timeout-s", "10")
        await until_status(stack, [victim], Status.SUCCEEDED)
        timeline = await stack.timeline(victim)
        leases = [(e.token, e.verdict) for e in timeline if e.kind == "JobLeased"]
        assert leases == [
            (MAX_TOKEN, Verdict.REJECTED),
            (2, Verdict.REJECTED),
            (1, Verdict.APPLIED),
        ], leases
    await until_node_past_the_end(stack)


def _forged(job_id: str, current: int) -> list[tuple[bytes, bytes]]:
    """A forger's leases of a due job: at the largest token, and one past the next."""
    meta = {"emitted_at": 0, "source": "node-forger", "attempt": 1, "lease_ms": 1_000}
    events = [
        JobLeased(event_id="forged-max", job_id=job_id, token=MAX_TOKEN, **meta),
        JobLeased(event_id="forged-skip", job_id=job_id, token=current + 2, **meta),
    ]
    return [(e.job_id.encode(), avro.encode_event(e)) for e in events]
