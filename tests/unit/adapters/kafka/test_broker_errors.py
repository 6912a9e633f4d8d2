"""Kafka's errors stop at the adapters: what the worker, the client and the operator see instead."""

from __future__ import annotations

import pytest
import typer
from aiokafka.errors import KafkaConnectionError
from structlog.testing import capture_logs

from evsched.adapters.kafka.dispatch_feed import KafkaDispatchFeed
from evsched.adapters.kafka.event_log import KafkaEventLog
from evsched.adapters.kafka.range_reader import KafkaRangeReader
from evsched.errors import BrokerUnavailable, PublishError
from evsched.operator.exits import ExitCode
from evsched.operator.session import guarded
from evsched.settings import Settings

NOWHERE = Settings(bootstrap="127.0.0.1:1", namespace="ns")


class Unreachable:
    """A Kafka client whose every call to the broker fails, as with no broker at all."""

    def __init__(self) -> None:
        self.stopped = False

    def subscribe(self, topics: object, listener: object = None) -> None:
        return None

    async def start(self) -> None:
        raise KafkaConnectionError("Unable to bootstrap")

    async def stop(self) -> None:
        self.stopped = True
        raise KafkaConnectionError("not connected")


async def test_a_feed_that_cannot_join_its_pool_is_broker_unavailable() -> None:
    client = Unreachable()
    feed = KafkaDispatchFeed(lambda: client, ["ns.dispatch.default"])
    with capture_logs() as logs, pytest.raises(BrokerUnavailable, match="could not start"):
        await feed.start()
    assert client.stopped
    assert [e["event"] for e in logs] == ["dispatch_consumer_stop_failed"]


async def test_closing_a_feed_whose_client_fails_to_stop_is_logged() -> None:
    client = Unreachable()
    feed = KafkaDispatchFeed(lambda: client, [])
    with pytest.raises(BrokerUnavailable):
        await feed.start()
    with capture_logs() as logs:
        await feed.close()
    assert [e["event"] for e in logs] == ["dispatch_consumer_stop_failed"]


async def test_closing_an_event_log_whose_producer_fails_to_stop_is_logged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class StartsThenFailsToStop(Unreachable):
        async def start(self) -> None:
            return None

    monkeypatch.setattr(
        "evsched.adapters.kafka.clients.producer", lambda settings, **_: StartsThenFailsToStop()
    )
    log = KafkaEventLog(NOWHERE, client_id="c")
    await log.start()
    with capture_logs() as logs:
        await log.close()
    assert [e["event"] for e in logs] == ["producer_stop_failed"]


async def test_an_export_without_a_broker_is_broker_unavailable() -> None:
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:1"):
        async with KafkaRangeReader(NOWHERE, "ns.events"):
            pass


def test_an_operator_command_meeting_an_unavailable_broker_exits_unavailable() -> None:
    def main() -> ExitCode:
        raise BrokerUnavailable("reaching Kafka at 127.0.0.1:1 failed")

    with pytest.raises(typer.Exit) as exited:
        guarded(main)
    assert exited.value.exit_code == ExitCode.UNAVAILABLE


async def test_an_event_log_that_cannot_start_its_producer_is_a_publish_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[Unreachable] = []
    monkeypatch.setattr(
        "evsched.adapters.kafka.clients.producer",
        lambda settings, **_: made.append(Unreachable()) or made[-1],
    )
    log = KafkaEventLog(NOWHERE, client_id="c")
    with capture_logs() as logs, pytest.raises(PublishError, match=r"cannot reach Kafka"):
        await log.append("ns.events", "job-1", b"v")
    assert [p.stopped for p in made] == [True]
    assert [e["event"] for e in logs] == ["producer_stop_failed"]
