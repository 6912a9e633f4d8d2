"""A new owner fences the open transaction of a committer gone from the group, not a live one."""

from __future__ import annotations

import asyncio

import pytest

from evsched.adapters.kafka.node_transactions import committer, committer_of
from evsched.adapters.kafka.pending_offsets import PendingOffsets
from evsched.errors import BrokerUnavailable


class _Group:
    """The broker's side: a committed offset, maybe held by an open transaction, and members."""

    def __init__(self, *, held: bool, members: set[str] | None, last: str | None) -> None:
        self.offset = 7
        self.held = held
        self.members = members  # None: the coordinator does not answer
        self.last = last
        self.fenced: list[str] = []
        self.reads: list[float] = []
        self.released = asyncio.Event()  # the holder's transaction ended by itself

    async def stable(self, partition: int, timeout_s: float) -> int | None:
        self.reads.append(timeout_s)
        if self.held:
            try:
                await asyncio.wait_for(self.released.wait(), timeout_s)
            except TimeoutError:
                raise BrokerUnavailable(f"p{partition} held") from None
            self.held = False
        return self.offset

    async def last_committer(self, partition: int) -> str | None:
        return self.last

    async def member_ids(self) -> set[str]:
        if self.members is None:
            raise BrokerUnavailable("no coordinator")
        return self.members

    async def fence(self, transactional_id: str) -> None:
        self.fenced.append(transactional_id)
        self.held = False  # its epoch aborted the transaction
        self.offset = 5  # what it held never became the committed offset

    def pending(self) -> PendingOffsets:
        return PendingOffsets(
            stable=self.stable,
            last_committer=self.last_committer,
            members=self.member_ids,
            fence=self.fence,
            pending_wait_s=0.01,
            live_wait_s=0.2,
            call_timeout_s=1.0,
        )


async def test_a_stable_offset_is_read_at_once() -> None:
    group = _Group(held=False, members=set(), last=committer("ns.node.a", "m-a"))
    assert await group.pending().committed(0) == 7
    assert group.fenced == [] and group.reads == [0.01]


async def test_a_dead_members_transaction_is_fenced() -> None:
    group = _Group(held=True, members={"m-b"}, last=committer("ns.node.a", "m-a"))
    assert await group.pending().committed(0) == 5
    assert group.fenced == ["ns.node.a"]


async def test_a_live_members_transaction_is_waited_for_not_fenced() -> None:
    group = _Group(held=True, members={"m-a", "m-b"}, last=committer("ns.node.a", "m-a"))
    read = asyncio.create_task(group.pending().committed(0))
    while len(group.reads) < 2:  # the first read gave up; the second waits for the member
        await asyncio.sleep(0.001)
    group.released.set()  # the live node commits its tick
    assert await read == 7
    assert group.fenced == []


async def test_a_live_member_still_open_past_the_transaction_timeout_is_fenced() -> None:
    group = _Group(held=True, members={"m-a"}, last=committer("ns.node.a", "m-a"))
    assert await group.pending().committed(0) == 5
    assert group.fenced == ["ns.node.a"]
    assert group.reads == [0.01, 0.2, 1.0]


async def test_unknown_members_are_waited_for_as_live() -> None:
    group = _Group(held=True, members=None, last=committer("ns.node.a", "m-a"))
    read = asyncio.create_task(group.pending().committed(0))
    while len(group.reads) < 2:
        await asyncio.sleep(0.001)
    group.released.set()
    assert await read == 7 and group.fenced == []


@pytest.mark.parametrize("last", ["ns.node.a", committer("ns.node.a", None)])
async def test_a_committer_without_member_is_fenced(last: str) -> None:
    # Offsets written before member ids were, or by a producer outside the group.
    group = _Group(held=True, members={"m-a"}, last=last)
    assert await group.pending().committed(0) == 5
    assert group.fenced == ["ns.node.a"]


async def test_no_known_committer_is_waited_for() -> None:
    group = _Group(held=True, members={"m-a"}, last=None)
    with pytest.raises(BrokerUnavailable):
        await group.pending().committed(0)
    assert group.fenced == [] and group.reads == [0.01, 1.0]


@pytest.mark.parametrize(
    ("metadata", "expected"),
    [
        (committer("ns.node.a b", "c d-1"), ("ns.node.a b", "c d-1")),
        (committer("ns.node.a", None), ("ns.node.a", None)),
        ("ns.node.a", ("ns.node.a", None)),
        ('{"member_id": "x"}', ('{"member_id": "x"}', None)),
        ('{"transactional_id": "t", "member_id": 3}', ("t", None)),
        ("[1]", ("[1]", None)),
    ],
)
def test_offsets_metadata_names_the_committer(
    metadata: str, expected: tuple[str, str | None]
) -> None:
    assert committer_of(metadata) == expected
