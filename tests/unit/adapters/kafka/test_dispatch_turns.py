"""The dispatch feed hands records out in turn across its partitions, and what it read ahead
never outlives the commit it was read after (a refused commit, or a new assignment)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError

from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed

TOPIC = "ns.dispatch.default"


class Client:
    """aiokafka's consumer as the feed uses it: per partition a log, a position and a commit.

    Like aiokafka, an unfiltered ``getmany`` hands out in a fixed partition order.
    """

    def __init__(self, logs: dict[int, list[str]]) -> None:
        self.logs = logs
        self.position = dict.fromkeys(logs, 0)
        self.committed = dict.fromkeys(logs, 0)
        self.paused_now: set[TopicPartition] = set()
        self.refuse = False

    def subscribe(self, topics: object, listener: object = None) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, p) for p in self.logs}

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_now)

    def pause(self, *tps: TopicPartition) -> None:
        self.paused_now |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_now -= set(tps)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(self.logs)

    async def getmany(
        self, *tps: TopicPartition, timeout_ms: int, max_records: int | None = None
    ) -> dict[TopicPartition, list[Any]]:
        wanted = sorted(tps or self.assignment(), key=lambda tp: tp.partition)
        left = max_records if max_records is not None else 1_000
        out: dict[TopicPartition, list[Any]] = {}
        for tp in wanted:
            if tp in self.paused_now or left <= 0:
                continue
            start = self.position[tp.partition]
            values = self.logs[tp.partition][start : start + left]
            if values:
                out[tp] = [_raw(tp.partition, start + i, v) for i, v in enumerate(values)]
                self.position[tp.partition] += len(values)
                left -= len(values)
        return out

    async def commit(self, offsets: dict[TopicPartition, tuple[int, str]]) -> None:
        if self.refuse:
            raise CommitFailedError("the group has already rebalanced")
        for tp, (offset, _) in offsets.items():
            self.committed[tp.partition] = offset

    def rejoin(self) -> None:
        """What a member evicted and back again reads from: the commits."""
        self.position = dict(self.committed)


def _raw(partition: int, offset: int, value: str) -> SimpleNamespace:
    return SimpleNamespace(
        topic=TOPIC, partition=partition, offset=offset, timestamp=1, key=b"k",
        value=value.encode(), headers=[],
    )  # fmt: skip


async def feed_over(client: Client) -> KafkaDispatchFeed:
    feed = KafkaDispatchFeed(lambda: client, [TOPIC])
    await feed.start()
    return feed


async def one_slot_at_a_time(feed: KafkaDispatchFeed, takes: int) -> list[str]:
    """A worker with one slot: take one, then be full (a take of 0) until it ends."""
    got = []
    for _ in range(takes):
        got += [(r.value or b"").decode() for r in await feed.take(1, 0.0)]
        assert await feed.take(0, 0.0) == []
    return got


async def test_a_worker_taking_one_at_a_time_serves_each_partition_in_turn() -> None:
    client = Client({0: [f"a{i}" for i in range(5)], 1: [f"b{i}" for i in range(5)], 2: ["c0"]})
    feed = await feed_over(client)
    # aiokafka's order alone served a0..a4 first: c0 waited for ten records.
    assert await one_slot_at_a_time(feed, 7) == ["a0", "b0", "c0", "a1", "b1", "a2", "b2"]
    assert client.committed == {0: 3, 1: 3, 2: 1}  # only what was handed out


async def test_records_read_ahead_of_a_refused_commit_are_not_handed_out_again() -> None:
    client = Client({0: ["a0", "a1"], 1: ["b0", "b1"]})
    feed = await feed_over(client)
    client.refuse = True
    assert await feed.take(1, 0.0) == []  # a0 was refused; b0 had been read ahead
    client.refuse = False
    client.rejoin()  # both partitions are read again from their commits
    got: list[str] = []
    for _ in range(4):
        got += [(r.value or b"").decode() for r in await feed.take(2, 0.0)]
    assert sorted(got) == ["a0", "a1", "b0", "b1"]  # b0 once, not twice


async def test_a_new_assignment_drops_what_was_read_ahead_on_it() -> None:
    client = Client({0: ["a0"], 1: ["b0"]})
    feed = await feed_over(client)
    assert await one_slot_at_a_time(feed, 1) == ["a0"]  # b0 read ahead
    tp = TopicPartition(TOPIC, 1)
    feed.forget([tp])  # what the rebalance listener does, revoked or assigned
    client.rejoin()
    assert await one_slot_at_a_time(feed, 2) == ["b0"]
