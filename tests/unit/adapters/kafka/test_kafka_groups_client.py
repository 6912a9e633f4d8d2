"""``GroupOwners`` keeps one admin client across asks, and drops it when an ask fails."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import KafkaConnectionError

from evsched.adapters.kafka import kept_admin as kafka_kept_admin
from evsched.adapters.kafka.groups import GroupOwners
from evsched.errors import BrokerUnavailable
from evsched.settings import Settings


class FakeAdmin:
    made: list[FakeAdmin] = []
    failing = False

    def __init__(self, **options: Any) -> None:
        self.started = self.closed = False
        FakeAdmin.made.append(self)

    async def start(self) -> None:
        self.started = True

    async def describe_consumer_groups(self, groups: list[str]) -> list[Any]:
        if FakeAdmin.failing:
            raise KafkaConnectionError("down")
        return []

    async def close(self) -> None:
        self.closed = True


async def test_one_admin_client_serves_every_ask_until_one_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kafka_kept_admin, "AIOKafkaAdminClient", FakeAdmin)
    FakeAdmin.made, FakeAdmin.failing = [], False
    owners = GroupOwners(Settings(namespace="groups"), timeout_s=1.0)
    assert await owners.ask("g", "t") == {}
    assert await owners.ask("g", "t") == {}
    assert len(FakeAdmin.made) == 1 and not FakeAdmin.made[0].closed
    FakeAdmin.failing = True
    with pytest.raises(BrokerUnavailable):
        await owners.ask("g", "t")
    assert FakeAdmin.made[0].closed  # a failed client is not kept
    FakeAdmin.failing = False
    assert await owners.ask("g", "t") == {}
    assert len(FakeAdmin.made) == 2
    await owners.close()
    assert FakeAdmin.made[1].closed
