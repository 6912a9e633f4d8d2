"""The ``workflow_results`` recording (fold version 5): a job keeps at most MAX_RESULTS_BYTES of
its parents' results. Five parents (``s.effect``) each return 250,002 bytes (1,250,010 together,
past the 1 MiB bound at the fifth): a group callback that was to get them is cancelled with the
reason when the fifth resolution comes; a plain ``after=`` child of the same parents, which takes
no results, is released and runs, the fifth result kept out of its state.
"""

from __future__ import annotations

from replay.scenario_workflows import _folded
from replay.scenarios import until_status
from tests.integration.engine import Stack

from evsched.client import group
from evsched.core.state import Status

SIZE = 250_000  # the tag is the effect's payload, its key and the result: 750 kB


async def workflow_results(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "10")
    stack.start_worker("worker-1", "--lease-s", "5", "--concurrency", "4")
    async with stack.app() as app:
        effect, total = app.get_task("s.effect"), app.get_task("s.total")
        noop = app.get_task("s.noop")
        fan = await app.enqueue_workflow(
            group([effect.s(f"{i}" * SIZE) for i in range(5)], callback=total.s())
        )
        *members, callback = fan.job_ids
        plain = await noop.options(after=members).enqueue()
        await until_status(stack, [*members, callback, plain])
    await _folded(stack)
    assert (await stack.job(callback)).status is Status.CANCELLED  # type: ignore[union-attr]
    assert (await stack.job(plain)).status is Status.SUCCEEDED  # type: ignore[union-attr]
