"""The node's committer outlives a failed tick whose steps clear the frames of what they raise."""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from evsched.adapters.kafka.node_transactions import NodeTransactions
from evsched.errors import BrokerUnavailable, Fenced
from evsched.settings import Settings


class _Holdback:
    def holds(self, decision: str) -> bool:
        return False

    def add(self, decision: str, kind: str, reason: str) -> None:
        raise AssertionError("nothing is held back here")


async def test_a_failed_tick_leaves_the_committer_alive_for_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transactions = NodeTransactions(
        Settings(namespace="ns"), transactional_id="ns.node.n", client_id="n", group_metadata=None
    )
    failures = [Fenced("transaction fenced: generation passed"), None]
    committed: list[list[int]] = []

    def transact(sends: Sequence[Any]) -> None:
        failure = failures.pop(0)
        if failure is not None:
            raise failure
        committed.append(sorted(s.partition for s in sends))

    async def no_metadata(sends: Sequence[Any]) -> None:
        return None

    monkeypatch.setattr(transactions, "_transact", transact)
    monkeypatch.setattr(transactions, "_hold_without_metadata", no_metadata)
    # Started without a broker: a producer stand-in, the wake-up and the committer task.
    transactions._producer = object()  # type: ignore[assignment]
    transactions._wake = asyncio.Event()
    transactions._task = asyncio.create_task(transactions._commits())

    async def step(partition: int) -> Exception:
        try:
            await transactions.send(partition, [], None, _Holdback())  # type: ignore[arg-type]
        except Exception as exc:
            # What a partition's step does with a failure (runtime.node.steps).
            traceback.clear_frames(exc.__traceback__)
            return exc
        raise AssertionError("the first tick fails")

    first, second = await asyncio.gather(step(0), step(1))
    assert isinstance(first, Fenced) and isinstance(second, Fenced)
    # The committer lives on: the next tick commits (it died of a cleared frame, and this send
    # waited forever).
    assert await asyncio.wait_for(transactions.send(2, [], None, _Holdback()), 5) == []  # type: ignore[arg-type]
    assert first is not second  # each step clears only its own frames
    assert committed == [[2]]
    await transactions.close()
    with pytest.raises(BrokerUnavailable):
        await transactions.send(0, [], None, _Holdback())  # type: ignore[arg-type]


async def test_a_producer_failing_fatally_outside_a_transaction_is_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    transactions = NodeTransactions(
        Settings(namespace="ns"), transactional_id="ns.node.n", client_id="n", group_metadata=None
    )

    def transact(sends: Sequence[Any]) -> None:  # begin_transaction of a fenced producer
        raise KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", True))

    async def no_metadata(sends: Sequence[Any]) -> None:
        return None

    monkeypatch.setattr(transactions, "_transact", transact)
    monkeypatch.setattr(transactions, "_hold_without_metadata", no_metadata)
    transactions._producer = object()  # type: ignore[assignment]
    transactions._wake = asyncio.Event()
    transactions._task = asyncio.create_task(transactions._commits())
    with pytest.raises(Fenced):
        await transactions.send(0, [], None, _Holdback())  # type: ignore[arg-type]

    async def replaced() -> None:
        while transactions._producer is not None:
            await asyncio.sleep(0.01)

    # Dropped, so the partitions' reopens start a new producer (before: every later tick
    # failed on the same fenced producer, forever).
    await asyncio.wait_for(replaced(), 5)
    await transactions.close()
