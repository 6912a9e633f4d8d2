"""until_broker: an outage is waited out, a refusal (misconfigured topic, denied) is not."""

from __future__ import annotations

import asyncio

import pytest

from evsched.adapters.kafka.topics import TopicMisconfigured, TopicProvisioningError, TopicRefused
from evsched.runtime.process.startup import until_broker


class Flaky:
    """Fails with ``error`` ``times`` times, then answers 42."""

    def __init__(self, error: Exception, times: int) -> None:
        self.error = error
        self.left = times
        self.calls = 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.left:
            self.left -= 1
            raise self.error
        return 42


async def test_an_unreachable_broker_is_retried_until_it_answers() -> None:
    action = Flaky(TopicProvisioningError("connection refused"), times=2)
    found = await until_broker(
        action, what="topics", stop=asyncio.Event(), first_s=0.001, max_s=0.002
    )
    assert (found, action.calls) == (42, 3)


@pytest.mark.parametrize(
    "refusal",
    [
        TopicRefused("creating topic 'ns.events' failed: TopicAuthorizationFailed"),
        TopicMisconfigured([]),
    ],
)
async def test_a_refusal_is_raised_at_once(refusal: Exception) -> None:
    action = Flaky(refusal, times=1)
    with pytest.raises(type(refusal)):
        await until_broker(action, what="topics", stop=asyncio.Event(), first_s=0.001)
    assert action.calls == 1


async def test_a_stop_while_waiting_gives_none() -> None:
    stop = asyncio.Event()
    stop.set()
    action = Flaky(TopicProvisioningError("down"), times=1)
    assert await until_broker(action, what="topics", stop=stop) is None
    assert action.calls == 0
