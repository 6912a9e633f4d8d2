"""aiokafka's coordinator look-ups that fail while a group forms are hidden at start-up, and only
those: another error shows, and so does the same one once a group joined or start-up is over.

The lines are logged by aiokafka's own ``ensure_coordinator_known`` (driven with a stand-in
client), so a change of what aiokafka logs there shows up here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
    KafkaError,
    NodeNotReadyError,
)

from evsched.adapters.kafka import client_logs
from evsched.adapters.kafka.client_logs import (
    COORDINATOR_LOGGER,
    StartupNoise,
    group_joined,
    hide_startup_noise,
)
from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed

FAILED = "Group Coordinator Request failed"


@pytest.fixture
def noise(monkeypatch: pytest.MonkeyPatch) -> Iterator[StartupNoise]:
    # A command run in this process earlier may have left its filter: this one replaces it.
    monkeypatch.setattr(client_logs, "_noise", client_logs._noise)
    installed = hide_startup_noise()
    yield installed
    logging.getLogger(COORDINATOR_LOGGER).removeFilter(installed)


async def look_up_coordinator(*answers: KafkaError) -> None:
    """aiokafka's coordinator look-up, answered with ``answers`` and then with node 1."""
    pending = list(answers)

    async def coordinator_lookup(kind: object, group_id: str) -> int:
        if pending:
            raise pending.pop(0)
        return 1

    async def nothing(*args: object, **kwargs: object) -> bool:
        return True

    client = SimpleNamespace(
        coordinator_lookup=coordinator_lookup, force_metadata_update=nothing, ready=nothing
    )
    closing: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    coordinator = SimpleNamespace(
        coordinator_id=None,
        group_id="evsched.nodes",
        _client=client,
        _closing=closing,
        _retry_backoff_ms=0,
        _coordinator_lookup_lock=asyncio.Lock(),
    )
    await asyncio.wait_for(GroupCoordinator.ensure_coordinator_known(coordinator), 10)
    assert coordinator.coordinator_id == 1


def failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == COORDINATOR_LOGGER]


async def test_a_coordinator_not_yet_there_is_hidden_until_the_group_joins(
    noise: StartupNoise, caplog: pytest.LogCaptureFixture
) -> None:
    await look_up_coordinator(GroupCoordinatorNotAvailableError(), GroupLoadInProgressError())
    assert failures(caplog) == []
    group_joined()
    assert noise.over
    await look_up_coordinator(GroupCoordinatorNotAvailableError())
    assert failures(caplog) == [f"{FAILED}: [Error 15] GroupCoordinatorNotAvailableError"]


@pytest.mark.usefixtures("noise")
async def test_another_error_shows_during_start_up(caplog: pytest.LogCaptureFixture) -> None:
    # A broker that cannot be reached is not a group being set up.
    await look_up_coordinator(NodeNotReadyError("no broker"))
    assert failures(caplog) == [f"{FAILED}: NodeNotReadyError: no broker"]
    logging.getLogger(COORDINATOR_LOGGER).error("Heartbeat session expired - marking it dead")
    assert failures(caplog)[-1] == "Heartbeat session expired - marking it dead"


def test_a_coordinator_away_past_the_start_up_shows() -> None:
    now = [100.0]
    noise = StartupNoise(start_up_s=60, clock=lambda: now[0])
    record = logging.LogRecord(
        COORDINATOR_LOGGER,
        logging.ERROR,
        __file__,
        1,
        f"{FAILED}: %s",
        (GroupCoordinatorNotAvailableError(),),
        None,
    )
    assert not noise.filter(record)
    now[0] = 159.9
    assert not noise.filter(record)
    now[0] = 160.0
    assert noise.filter(record)
    assert noise.over


class PoolConsumer:
    def subscribe(self, topics: object, listener: object = None) -> None: ...

    async def start(self) -> None: ...


async def test_the_worker_pool_joining_ends_the_start_up(noise: StartupNoise) -> None:
    feed = KafkaDispatchFeed(PoolConsumer, ["ns.dispatch.default"])
    assert not noise.over
    await feed.start()
    assert noise.over
