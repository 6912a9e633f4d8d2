"""A queue's global concurrency limit from the client: the checked event, written to the queue's
home partition first and then to every other events partition.

Home first: a partition that folded the new limit then knows the home has it too, so a lowered
limit is never enforced by the job partitions before the home that grants the permits.
"""

from __future__ import annotations

from evsched.adapters.ids import new_id
from evsched.adapters.kafka_events import partition_for
from evsched.commands import build_limit, encode_checked
from evsched.core.events import QueueLimitSet
from evsched.errors import PublishError
from evsched.ports import Appended, EventLog, Outbound


def limit_event(queue: str, max_running: int | None, *, reason: str, now_ms: int) -> QueueLimitSet:
    """A checked QueueLimitSet (``max_running`` None removes the limit); InvalidEnqueue if bad."""
    return build_limit(queue, max_running, reason=reason, now_ms=now_ms, event_id=new_id())


async def publish_limit(log: EventLog, topic: str, event: QueueLimitSet) -> list[Appended]:
    """``event`` to the queue's home partition, then to every other partition of ``topic``.

    PublishError when a write failed; writing the limit again is safe (a repeated limit applies
    again with the same value).
    """
    data = encode_checked(event)
    count = await log.partition_count(topic)
    home = partition_for(event.queue, count)
    order = [home] + [p for p in range(count) if p != home]
    appended: list[Appended] = []
    for batch in (order[:1], order[1:]):
        results = await log.append_many(
            topic, [Outbound(event.queue, data, partition=p) for p in batch]
        )
        failed = [r for r in results if isinstance(r, PublishError)]
        if failed:
            raise PublishError(
                f"QueueLimitSet reached {len(appended)} of {count} partitions ({failed[0]}); "
                "write it again"
            )
        appended += [r for r in results if isinstance(r, Appended)]
    return appended
