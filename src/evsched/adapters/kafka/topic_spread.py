"""Waiting until every broker lists a topic just created.

A broker learns of a new topic from the cluster's metadata log a moment after the controller
commits it; until then it answers "unknown topic". A client that asks a broker picked at random
(an admin's listing, the queue catalog) right after the create may hear that the queue is not
declared. ``spread`` asks each broker in turn, so an operator's create returns once whichever
broker a client asks would say the topic exists.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaClient
from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

from evsched.adapters.clock import monotonic_s

# A broker frozen but not yet fenced never answers: past this the create returns anyway (the
# topic exists; a lagging broker still learns of it, just later).
SPREAD_WAIT_S = 10.0
_PAUSE_S = 0.1


async def spread(
    bootstrap: str, names: Sequence[str], *, wait_s: float = SPREAD_WAIT_S, **client_options: Any
) -> list[int]:
    """Wait until every broker of the cluster lists ``names``; the brokers that still did not
    when ``wait_s`` ran out (empty when all of them did, or when none could be asked)."""
    client = AIOKafkaClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=max(1, int(wait_s * 1000)),
        client_id="evsched-topics",
        **client_options,
    )
    lagging: set[int] = set()
    deadline = monotonic_s() + wait_s
    try:
        async with asyncio.timeout(wait_s):
            await client.bootstrap()
            lagging = {broker.nodeId for broker in client.cluster.brokers()}
            while lagging:
                for node_id in sorted(lagging):
                    if await _lists(client, node_id, names):
                        lagging.discard(node_id)
                if not lagging or monotonic_s() + _PAUSE_S >= deadline:
                    break
                await asyncio.sleep(_PAUSE_S)
    except (KafkaError, TimeoutError):
        pass  # the topics exist; a broker that cannot be asked is left to learn of them later
    finally:
        await client.close()
    return sorted(lagging)


async def _lists(client: AIOKafkaClient, node_id: int, names: Sequence[str]) -> bool:
    try:
        request = MetadataRequest(list(names), allow_auto_topic_creation=False)
        response = await client.send(node_id, request)
    except KafkaError:
        return False
    listed = {t["topic"] for t in response.to_object()["topics"] if t["error_code"] == 0}
    return set(names) <= listed
