"""How many brokers a cluster has, for a new topic's replication: those its metadata lists, and
those fenced for a moment (a restart) that the topics' replica lists still name.

A restarting broker (or one frozen past its session) is missing from the metadata's broker list
until the controller unfences it, but it is still registered, and KRaft places replicas on it.
Counting only the listed brokers gave a topic created in that moment two replicas and min ISR 1
for good (CI: the cluster test after the one that restarts a killed broker).
"""

from __future__ import annotations

from typing import Any

from aiokafka.admin import AIOKafkaAdminClient


async def count_brokers(admin: AIOKafkaAdminClient, enough: int | None = None) -> int:
    """The cluster's brokers, listed or holding replicas, as the broker that answers sees them.

    When the listed brokers are already ``enough`` (no choice made from the count needs more),
    the topics are not described: that reads every topic of the cluster.
    """
    cluster: dict[str, Any] = await admin.describe_cluster()
    listed = {broker["node_id"] for broker in cluster.get("brokers") or ()}
    if enough is not None and len(listed) >= enough:
        return len(listed)
    topics: list[dict[str, Any]] = await admin.describe_topics()
    holding = {
        replica
        for topic in topics
        for partition in topic.get("partitions") or ()
        for replica in partition.get("replicas") or ()
    }
    return len(listed | holding)
