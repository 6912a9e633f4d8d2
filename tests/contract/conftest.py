"""Fixtures of the contract suites: settings for the shared broker, and waiting with a deadline.

Each suite is an abstract class (``<Port>Contract``) whose tests speak to a harness fixture;
a subclass per implementation provides it (pyeventsourcing's ``tests/persistence.py`` pattern).
Subclasses on Kafka use the ``kafka_bootstrap`` fixture, so they are ``broker`` tests: skipped
without a broker on a laptop, failed under ``CI=true``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from evsched.settings import Settings

# Under the load of a shared 2-core machine a group join takes seconds: generous, not tight.
DEADLINE_S = 30.0

T = TypeVar("T")


@pytest.fixture
def settings(kafka_bootstrap: str, namespace: str) -> Settings:
    """Settings for the test's own namespace, whose topics exist (see tests/conftest.py)."""
    return Settings(bootstrap=kafka_bootstrap, namespace=namespace, event_partitions=3)


async def eventually(
    attempt: Callable[[], Awaitable[T | None]], what: str, timeout_s: float = DEADLINE_S
) -> T:
    """The first result of ``attempt`` that is not None; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await attempt()
        if result is not None:
            return result
        await asyncio.sleep(0)
    raise AssertionError(f"not within {timeout_s} s: {what}")
