"""Global limits from the client: the checked event of a queue's or a concurrency key's limit,
written to the limit's home partition first and then to every other events partition; and the
label that gives a job its concurrency key.

Home first: a partition that folded the new limit then knows the home has it too, so a lowered
limit is never enforced by the job partitions before the home that grants the permits.
"""

from __future__ import annotations

from collections.abc import Mapping

from evsched.adapters.ids import new_id
from evsched.adapters.kafka.partition_log import partition_for
from evsched.commands import build_limit, encode_checked
from evsched.core.events import KeyLimitSet, QueueLimitSet, entity_id
from evsched.core.permits import KEY_LABEL, MAX_KEY_BYTES
from evsched.errors import InvalidEnqueue, PublishError
from evsched.ports import Appended, EventLog, Outbound


def limit_event(
    name: str,
    *,
    key: bool = False,
    max_running: int | None = None,
    rate: tuple[int, int] | None = None,
    reason: str = "",
    now_ms: int,
) -> QueueLimitSet | KeyLimitSet:
    """A checked QueueLimitSet (or KeyLimitSet with ``key``); InvalidEnqueue names a bad field."""
    return build_limit(
        name,
        key=key,
        max_running=max_running,
        rate=rate,
        reason=reason,
        now_ms=now_ms,
        event_id=new_id(),
    )


def with_concurrency_key(
    labels: Mapping[str, str] | None, key: str | None
) -> Mapping[str, str] | None:
    """``labels`` with the job's concurrency key (a label), checked; InvalidEnqueue if bad."""
    if key is None:
        return labels
    if not isinstance(key, str) or not key or len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidEnqueue("concurrency_key", f"must be 1 to {MAX_KEY_BYTES} UTF-8 bytes")
    return {**(labels or {}), KEY_LABEL: key}


async def publish_limit(
    log: EventLog, topic: str, event: QueueLimitSet | KeyLimitSet
) -> list[Appended]:
    """``event`` to the limit's home partition, then to every other partition of ``topic``.

    PublishError when a write failed; writing the limit again is safe (a repeated limit applies
    again with the same value).
    """
    data = encode_checked(event)
    count = await log.partition_count(topic)
    name = entity_id(event)
    home = partition_for(name, count)
    order = [home] + [p for p in range(count) if p != home]
    appended: list[Appended] = []
    for batch in (order[:1], order[1:]):
        results = await log.append_many(topic, [Outbound(name, data, partition=p) for p in batch])
        failed = [r for r in results if isinstance(r, PublishError)]
        if failed:
            raise PublishError(
                f"{type(event).__name__} reached {len(appended)} of {count} partitions "
                f"({failed[0]}); write it again"
            )
        appended += [r for r in results if isinstance(r, Appended)]
    return appended
