"""The ``orphans`` recording (fold version 6): rejected events of jobs the index does not hold
expire from the log. A job with a 5 s retention runs and is purged; a zombie worker's late
``AttemptStarted`` and ``AttemptSucceeded`` of it come in ``rejected`` ("unknown job") and follow
the purge's mark; a forger's events for an id never enqueued (a cancel, a start, a purge) are
``rejected`` and get marks of their own, for 7 days of log time. Then a job with a 1 s retention
on each partition is purged after the mark's time, and the purged job's purge entry and both late
events leave every index, while the forged ones stay.
"""

from __future__ import annotations

from replay.scenarios import produce_raw, until_node_past_the_end
from tests.integration.engine import Stack, wait_for
from tests.integration.test_retention_orphans import key_on

from evsched.adapters import avro, clock
from evsched.core.events import AttemptStarted, AttemptSucceeded, JobCancelled, JobPurged
from evsched.core.state import Verdict

GHOST = "ghost-never-enqueued"
WAIT_S = 600.0  # processes are slow to start on a loaded machine; every wait is on a condition


async def orphans(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "10")
    stack.start_worker("worker-1", "--lease-s", "3")
    async with stack.app() as app:
        effect = app.get_task("s.effect")
        purged = await effect.options(retention=5).enqueue("purged, then late events")
        await _until_applied(stack, purged, "JobPurged", 1)
        await produce_raw(stack, _late_and_forged(purged, token=1))  # its one lease's token
        await _until_judged(stack, purged, 3)
        await _until_judged(stack, GHOST, 3)
        await _until_log_time_passes(stack, purged, 5_000)
        triggers = [
            await effect.options(idempotency_key=key_on(p, stack.partitions), retention=1).enqueue(
                "trigger"
            )
            for p in range(stack.partitions)
        ]
        for job_id in triggers:
            await _until_applied(stack, job_id, "JobPurged", 1)

        async def expired() -> bool:
            return await stack.timeline(purged) == []

        await wait_for(expired, what="the purge mark and its followers to expire", timeout_s=WAIT_S)
        assert [e.verdict for e in await stack.timeline(GHOST)] == [Verdict.REJECTED] * 3
    await until_node_past_the_end(stack)


async def _until_applied(stack: Stack, job_id: str, kind: str, count: int) -> None:
    async def enough() -> bool:
        timeline = await stack.timeline(job_id)
        return sum(e.kind == kind and e.verdict is Verdict.APPLIED for e in timeline) >= count

    await wait_for(enough, what=f"{count} applied {kind} of {job_id}", timeout_s=WAIT_S)


async def _until_log_time_passes(stack: Stack, job_id: str, retention_ms: int) -> None:
    """Until the wall clock (the broker's log time, on this host) is past the purge mark's time:
    a purge applied before it would leave the mark, and no purge would come after."""
    purge = next(e for e in await stack.timeline(job_id) if e.kind == "JobPurged")

    async def past() -> bool:
        return clock.now_ms() > purge.log_at + retention_ms + 1_000

    await wait_for(past, what=f"log time past {job_id}'s purge mark", timeout_s=WAIT_S)


async def _until_judged(stack: Stack, job_id: str, count: int) -> None:
    async def judged() -> bool:
        return len(await stack.timeline(job_id)) >= count

    await wait_for(judged, what=f"{count} events of {job_id} folded", timeout_s=WAIT_S)


def _late_and_forged(purged: str, token: int) -> list[tuple[bytes, bytes]]:
    zombie = {"emitted_at": 0, "source": "worker-zombie"}
    forger = {"emitted_at": 0, "source": "forger"}
    events = [
        AttemptStarted(
            event_id="late-1", job_id=purged, token=token, worker_id="worker-zombie",
            lease_ms=3_000, **zombie,
        ),
        AttemptSucceeded(event_id="late-2", job_id=purged, token=token, result=b"1", **zombie),
        JobCancelled(event_id="forged-o1", job_id=GHOST, **forger),
        AttemptStarted(
            event_id="forged-o2", job_id=GHOST, token=1, worker_id="w", lease_ms=1, **forger
        ),
        JobPurged(event_id="forged-o3", job_id=GHOST, generation=0, **forger),
    ]  # fmt: skip
    return [(e.job_id.encode(), avro.encode_event(e)) for e in events]
