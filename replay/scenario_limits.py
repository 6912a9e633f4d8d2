"""The ``limits`` run: global concurrency and rate limits on real processes (two nodes).

Kept apart from ``scenarios.py``; ``record.py`` records it.
"""

from __future__ import annotations

from replay.scenarios import _logged, produce_raw, until_node_past_the_end, until_status
from tests.integration.engine import Stack, wait_for, wait_path

from evsched.adapters import avro
from evsched.core.events import JobLeased, PermitGranted, QueueLimitSet, QueuePermit
from evsched.core.state import Status


async def limits(stack: Stack) -> None:
    """Queue default limited to 2 running and 4 grants per second, key cust-1 to 1 running: jobs
    wait for permits from the limits' homes and run; a job of key cust-2 holds its permit while
    a second one waits, and a zombie's lease of the waiting one is rejected; forged permit steps
    and a limit beyond the bounds are rejected."""
    node = stack.start_node("node-1")
    stack.start_node("node-2")
    for name in ("worker-1", "worker-2"):
        stack.start_worker(name, "--lease-s", "3")
    await wait_for(lambda: _logged(node, "partition_assigned"), what="node up")
    async with stack.app() as app:
        await app.limit_queue("default", max_running=2, rate=(4, 1_000))
        await app.limit_key("cust-1", max_running=1)
        await app.limit_key("cust-2", max_running=1)
        marks = stack.tmp / "counts"
        marks.mkdir()
        counts = [await app.enqueue("s.count", str(marks), 2) for _ in range(6)]
        noop = app.get_task("s.noop").options(concurrency_key="cust-1")
        keyed = [await noop.enqueue() for _ in range(3)]
        gate = stack.tmp / "gated"
        gate.mkdir()
        gated = app.get_task("s.gated").options(concurrency_key="cust-2")
        holder = await gated.enqueue(str(gate), "holder")
        await wait_path(gate / "started-1-1")
        waiter = await gated.enqueue(str(gate), "waiter")
        await until_status(stack, counts + keyed, Status.SUCCEEDED)
        await until_node_past_the_end(stack)
        await produce_raw(stack, _forged(waiter, counts[0]))
        await until_node_past_the_end(stack)
        (gate / "go").touch()
        await until_status(stack, [holder, waiter], Status.SUCCEEDED)
    await until_node_past_the_end(stack)


def _forged(waiter: str, finished: str) -> list[tuple[bytes, bytes]]:
    lease = JobLeased(event_id="zombie-lease", job_id=waiter, emitted_at=0, source="node-zombie",
                      token=1, attempt=1, lease_ms=30_000)  # fmt: skip
    late = QueuePermit(event_id="forged-grant", queue="default", job_id=finished, action="grant",
                       emitted_at=0, source="forger")  # fmt: skip
    odd = QueuePermit(event_id="forged-action", queue="default", job_id=finished, action="take",
                      emitted_at=0, source="forger")  # fmt: skip
    ghost = PermitGranted(event_id="forged-ghost", job_id="ghost", emitted_at=0, source="forger",
                          queue="default")  # fmt: skip
    zero = QueueLimitSet(event_id="forged-limit", queue="default", emitted_at=0, source="forger",
                         max_running=0)  # fmt: skip
    return [
        (waiter.encode(), avro.encode_event(lease)),
        (b"default", avro.encode_event(late)),
        (b"default", avro.encode_event(odd)),
        (b"ghost", avro.encode_event(ghost)),
        (b"default", avro.encode_event(zero)),
    ]
