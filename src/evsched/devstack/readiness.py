"""Asking a broker whether it answers metadata requests, from sync code as well as async."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

T = TypeVar("T")


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    # A broker that is still starting refuses requests; that is expected, not worth an error line.
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


async def metadata_answers(bootstrap: str, timeout_ms: int = 3000, **client_options: Any) -> bool:
    """True when the cluster at ``bootstrap`` answers a metadata request listing a broker.

    ``client_options`` (TLS/SASL) go to aiokafka's admin client as they are.
    """
    return await broker_count(bootstrap, timeout_ms, **client_options) > 0


async def broker_count(bootstrap: str, timeout_ms: int = 3000, **client_options: Any) -> int:
    """How many brokers the cluster at ``bootstrap`` lists; 0 when it does not answer."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=timeout_ms,
        client_id="evsched-devstack",
        **client_options,
    )
    with _quiet("aiokafka"):
        try:
            await admin.start()
            cluster: dict[str, Any] = await admin.describe_cluster()
        except (KafkaError, OSError, TimeoutError):
            return 0
        finally:
            await admin.close()
    return len(cluster.get("brokers") or ())


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from sync code, even when an event loop already runs here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()
