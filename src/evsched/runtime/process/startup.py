"""Starting against a broker that may not be up yet: retry with a growing wait and a log line.

A node or worker started before its broker (a reboot, a deploy racing the cluster) waits for it
instead of exiting. A topic that exists but is configured wrongly is not a broker outage: it is
raised at once, for the command line to print in one line.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from evsched.adapters.kafka.topics import TopicMisconfigured, TopicProvisioningError, TopicRefused
from evsched.errors import BrokerUnavailable

log = structlog.get_logger("evsched.startup")
T = TypeVar("T")

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 30.0


async def until_broker(
    action: Callable[[], Awaitable[T]],
    *,
    what: str,
    stop: asyncio.Event,
    first_s: float = RETRY_FIRST_S,
    max_s: float = RETRY_MAX_S,
) -> T | None:
    """``await action()`` until it succeeds; None when ``stop`` is set while waiting.

    Broker errors (unreachable, timed out) are retried after 1, 2, 4 … ``max_s`` seconds, each
    with a ``broker_unavailable`` warning; TopicMisconfigured and TopicRefused are raised.
    """
    wait_s = first_s
    tries = 0
    while not stop.is_set():
        tries += 1
        try:
            return await action()
        except (TopicMisconfigured, TopicRefused):
            raise
        except (TopicProvisioningError, BrokerUnavailable, OSError, TimeoutError) as exc:
            log.warning(
                "broker_unavailable", what=what, error=str(exc), tries=tries, retry_in_s=wait_s
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait_s)
        wait_s = min(max_s, wait_s * 2)
    return None
