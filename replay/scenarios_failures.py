"""The ``failures`` recording (fold version 3): issue 13's items 4, 5 and 10 on a real run.

Failures with a category and a traceback (an app's own category, permanent, timeout), a cancel
that reaches a running handler (its report comes in rejected), a succeeded job requeued without
``rerun`` (rejected) and with it (applied, and it runs again), and a hostile producer's failure
reports beyond the limits (an oversized traceback, a category that is no snake_case name).
"""

from __future__ import annotations

from replay.scenarios import produce_raw, until_status
from tests.integration.engine import Stack, wait_for, wait_path
from tests.integration.follow_app import make_app

from evsched.adapters import avro
from evsched.core.events import AttemptFailed
from evsched.core.failures import MAX_TRACEBACK_CHARS
from evsched.core.state import Status

FOLLOW_APP = "tests.integration.follow_app:app"


async def failures(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "5")
    stack._spawn("worker-1", ["worker", "--app", FOLLOW_APP, "--concurrency", "8"])

    async with make_app(stack.settings) as app:
        dead = [
            await app.enqueue("f.billing"),
            await app.enqueue("f.bad_input"),
            await app.enqueue("f.slow"),
        ]
        marks = stack.tmp / "count"
        marks.mkdir()
        counting = await app.enqueue("f.count", str(marks), 200)
        await wait_path(marks / "step-3", what="three steps counted")
        await app.cancel(counting, reason="stop counting")
        runs = stack.tmp / "runs"
        runs.mkdir()
        rerun = await app.enqueue("f.runs", str(runs))
        await rerun.result(timeout=120)
        await app.requeue(rerun, reason="not without rerun")
        again = await app.requeue(rerun, rerun=True, reason="run it again")
        await again.result(timeout=120)
        await until_status(stack, [*dead, counting, rerun])
        await _reported(stack, counting)
        await produce_raw(stack, _hostile(dead[0]))
    end = await stack.read_topic(stack.topics.events)
    for partition in range(stack.partitions):
        offsets = [r.offset for r in end if r.partition == partition]
        if offsets:
            await stack.wait_node_past(partition, max(offsets))
    assert (await stack.job(dead[0])) is not None
    assert (await stack.job(rerun)).status is Status.SUCCEEDED  # type: ignore[union-attr]


async def _reported(stack: Stack, job_id: str) -> None:
    async def done() -> bool:
        return any(e.kind == "AttemptFailed" for e in await stack.timeline(job_id))

    await wait_for(done, what="the cancelled attempt's report", timeout_s=120)


def _hostile(job_id: str) -> list[tuple[bytes, bytes]]:
    meta = {"job_id": job_id, "emitted_at": 0, "source": "forger", "token": 1}
    events = [
        AttemptFailed(
            event_id="forged-f1",
            error_type="E",
            message="m",
            traceback="t" * (MAX_TRACEBACK_CHARS + 1),
            **meta,  # type: ignore[arg-type]
        ),
        AttemptFailed(
            event_id="forged-f2",
            error_type="E",
            message="m",
            category="Not A Category",
            **meta,  # type: ignore[arg-type]
        ),
    ]
    return [(job_id.encode(), avro.encode_event(e)) for e in events]
