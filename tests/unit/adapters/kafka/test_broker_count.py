"""The broker count a new topic's replication is chosen from: a broker fenced for a moment (a
restart) still counts while the topics' replica lists name it."""

from __future__ import annotations

from typing import Any

from evsched.adapters.kafka.broker_count import count_brokers


class Admin:
    """Answers metadata as a cluster would: the ``listed`` brokers, and topics' replica lists."""

    def __init__(self, listed: set[int], replicas: list[list[int]]) -> None:
        self.listed = listed
        self.replicas = replicas

    async def describe_cluster(self) -> dict[str, Any]:
        return {"brokers": [{"node_id": n, "host": "h", "port": 1} for n in sorted(self.listed)]}

    async def describe_topics(self) -> list[dict[str, Any]]:
        partitions = [{"partition": i, "replicas": r} for i, r in enumerate(self.replicas)]
        return [{"topic": "t", "partitions": partitions}, {"topic": "gone", "partitions": []}]


async def test_a_fenced_broker_that_holds_replicas_is_counted() -> None:
    # Broker 3 restarts: fenced, so not listed, but the topics still name it among their replicas.
    assert await count_brokers(Admin({1, 2}, replicas=[[1, 2, 3], [2, 3, 1]])) == 3


async def test_listed_brokers_count_without_replicas() -> None:
    assert await count_brokers(Admin({1, 2, 3}, replicas=[[1]])) == 3
    assert await count_brokers(Admin({1}, replicas=[])) == 1
