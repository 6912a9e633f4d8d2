"""Pause and resume of queues and schedules from the client: the events, and a write to every
events partition.

A queue's pause is written to every events partition with an explicit partition number, since
each partition's owner decides the leases of the queue's jobs there (docs/job-lifecycle.md).
"""

from __future__ import annotations

from evsched.adapters.ids import new_id
from evsched.commands import build_control, encode_checked
from evsched.core.events import ControlEvent, entity_id
from evsched.errors import PublishError
from evsched.ports import Appended, EventLog, Outbound


def control_event(kind: type[ControlEvent], name: str, *, reason: str, now_ms: int) -> ControlEvent:
    """A checked pause or resume of the queue or schedule ``name``; InvalidEnqueue if bad."""
    return build_control(kind, name, reason=reason, now_ms=now_ms, event_id=new_id())


async def publish_everywhere(log: EventLog, topic: str, event: ControlEvent) -> list[Appended]:
    """``event`` to every partition of ``topic``, keyed by its entity, in one round trip.

    PublishError when any partition's write failed; writing the control again is safe (the
    partitions that have it answer ``rejected``).
    """
    data = encode_checked(event)
    count = await log.partition_count(topic)
    key = entity_id(event)
    results = await log.append_many(topic, [Outbound(key, data, partition=p) for p in range(count)])
    failed = [r for r in results if isinstance(r, PublishError)]
    if failed:
        raise PublishError(
            f"{type(event).__name__} reached {count - len(failed)} of {count} partitions "
            f"({failed[0]}); write it again"
        )
    return [r for r in results if isinstance(r, Appended)]
