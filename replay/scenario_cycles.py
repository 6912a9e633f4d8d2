"""The ``batch_cycles`` recording (fold version 9, issue 32): a cycle of two waits ends.

The client and the API refuse a batch whose jobs wait on one another in a cycle before writing
anything; a foreign producer can still write one. Here it enqueues ``cycle-a`` after ``cycle-b``
and ``cycle-b`` after ``cycle-a``, both before either registration, then the two
``ChildRegistered``. Each parent's fold rejects the registration of a child it itself waits on
("cycle: ...") and answers it ``refused``, so neither job waits for ever: both are cancelled.
A plain chain written the same way (``chain-a`` after ``chain-b``) runs as usual.
"""

from __future__ import annotations

from replay.scenarios import produce_raw, until_node_past_the_end, until_status
from tests.integration.engine import Stack

from evsched.adapters import avro
from evsched.core.events import ChildRegistered, Event, JobEnqueued, entity_id
from evsched.core.state import Status


async def batch_cycles(stack: Stack) -> None:
    stack.start_node("node-1", "--dispatch-timeout-s", "10")
    stack.start_worker("worker-1")
    meta = {"emitted_at": 0, "source": "foreign-producer"}

    def enqueue(job_id: str, after: str | None) -> JobEnqueued:
        return JobEnqueued(
            event_id=f"enq-{job_id}", job_id=job_id, task="s.noop", queue="default",
            args=b'{"args":[],"kwargs":{}}', after=() if after is None else (after,), **meta,
        )  # type: ignore[arg-type]  # fmt: skip

    def register(parent: str, child: str) -> ChildRegistered:
        return ChildRegistered(
            event_id=f"reg-{parent}-{child}", job_id=parent, child_id=child, **meta
        )  # type: ignore[arg-type]

    events: list[Event] = [
        enqueue("cycle-a", "cycle-b"),
        enqueue("cycle-b", "cycle-a"),
        enqueue("chain-b", None),
        enqueue("chain-a", "chain-b"),
        register("cycle-b", "cycle-a"),
        register("cycle-a", "cycle-b"),
        register("chain-b", "chain-a"),
    ]
    await produce_raw(stack, [(entity_id(e).encode(), avro.encode_event(e)) for e in events])
    await until_status(stack, ["cycle-a", "cycle-b"], Status.CANCELLED)
    await until_status(stack, ["chain-a", "chain-b"], Status.SUCCEEDED)
    await until_node_past_the_end(stack)
