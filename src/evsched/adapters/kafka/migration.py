"""Records to several topics in Kafka transactions: a namespace migration's pairs (enqueued in the
new namespace, ended in the old) become visible together or not at all."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from aiokafka.errors import KafkaError

from evsched.adapters.kafka import clients as kafka
from evsched.errors import BrokerUnavailable
from evsched.ports import Outgoing
from evsched.settings import Settings

# Groups per transaction: a transaction stays far below the broker's timeout and size limits.
GROUPS_PER_TRANSACTION = 200


async def write_atomically(
    settings: Settings,
    groups: Sequence[Sequence[Outgoing]],
    *,
    transactional_id: str,
    per_transaction: int = GROUPS_PER_TRANSACTION,
) -> int:
    """Write each group's records in one transaction with the others of its batch; the number of
    groups written. BrokerUnavailable when a transaction failed (nothing of it is visible:
    what committed before stays, so writing every group again only adds duplicates).

    A second writer with the same ``transactional_id`` fences the first (its open transaction is
    aborted), so two migrations of one namespace never interleave their batches.
    """
    producer = kafka.producer(
        settings, client_id="evsched-migrate", transactional_id=transactional_id
    )
    written = 0
    try:
        await producer.start()
        for start in range(0, len(groups), per_transaction):
            batch = groups[start : start + per_transaction]
            async with producer.transaction():
                acks = [
                    await producer.send(o.topic, o.value, key=o.key, partition=o.partition)
                    for group in batch
                    for o in group
                ]
                await asyncio.gather(*acks)
            written += len(batch)
    except KafkaError as exc:
        raise BrokerUnavailable(
            f"a migration transaction failed after {written} of {len(groups)} moves: {exc!r}"
        ) from exc
    finally:
        with contextlib.suppress(KafkaError):
            await producer.stop()
    return written
