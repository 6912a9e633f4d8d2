"""A bound on waiting for a write's ack, and its cause named when the partition lacks replicas.

An idempotent aiokafka producer never expires a batch: it retries ``NotEnoughReplicas`` (fewer
replicas in sync than the topic's ``min.insync.replicas``) and a leaderless partition for as long
as the brokers stay down, so a caller awaiting the ack would hang that long. ``acknowledged``
waits at most ``timeout_s``; while it waits it asks the cluster (``ReplicaCheck``, one describe per
topic and second, shared by every waiter) whether the record's partition can take writes at all,
and fails at once, naming the partition and its replicas, when it cannot. The record stays with
the producer: it may still be written once the replicas return, which is why the error says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from evsched.adapters.clock import monotonic_s
from evsched.errors import NotEnoughReplicas, PublishError
from evsched.settings import Settings

T = TypeVar("T")

# How long an ack may take before the partition is looked at, and how long a look is reused.
CHECK_AFTER_S = 1.0
# What one look at the cluster may take; a look that fails or takes longer names no cause.
DESCRIBE_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionReplicas:
    """One partition as the cluster describes it, with its topic's min ISR."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_isr: int

    def problem(self) -> str | None:
        """Why the partition cannot acknowledge an acks=all write now, or None."""
        where = f"partition {self.partition} of {self.topic!r}"
        if self.leader < 0:
            return f"{where} has no leader (replicas on brokers {list(self.replicas)} are down)"
        if len(self.isr) < self.min_isr:
            down = sorted(set(self.replicas) - set(self.isr))
            return (
                f"{where} has {len(self.isr)} in-sync replica(s) {list(self.isr)}, fewer than "
                f"its min.insync.replicas={self.min_isr} (brokers {down} are down or behind)"
            )
        return None


Describe = Callable[[str], Coroutine[Any, Any, dict[int, PartitionReplicas]]]


async def describe_partitions(settings: Settings, topic: str) -> dict[int, PartitionReplicas]:
    """Every partition of ``topic``: leader, replicas, ISR, and the topic's min ISR."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap, client_id="evsched-replica-check",
        request_timeout_ms=int(DESCRIBE_TIMEOUT_S * 1000), **dict(settings.kafka_options),
    )  # fmt: skip
    await admin.start()
    try:
        [found] = await admin.describe_topics([topic])
        [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    [resource] = response.to_object()["resources"]
    configs = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
    min_isr = int(configs.get("min.insync.replicas") or 1)
    return {
        int(p["partition"]): PartitionReplicas(
            topic=topic,
            partition=int(p["partition"]),
            leader=int(p["leader"]),
            replicas=tuple(p["replicas"]),
            isr=tuple(p["isr"]),
            min_isr=min_isr,
        )
        for p in found.get("partitions") or []
    }


class ReplicaCheck:
    """Why a partition cannot take acks=all writes, from a describe shared by all who ask."""

    def __init__(self, describe: Describe, *, fresh_s: float = CHECK_AFTER_S) -> None:
        self._describe = describe
        self._fresh_s = fresh_s
        self._looks: dict[str, tuple[float, asyncio.Task[dict[int, PartitionReplicas]]]] = {}

    async def problem(self, topic: str, partition: int) -> str | None:
        """The partition's problem, or None (also when the cluster could not be asked)."""
        found = await self.partitions(topic)
        described = None if found is None else found.get(partition)
        return None if described is None else described.problem()

    async def partitions(self, topic: str) -> dict[int, PartitionReplicas] | None:
        """Every partition of ``topic`` as last described, or None when the cluster could not
        be asked within DESCRIBE_TIMEOUT_S."""
        look = self._looks.get(topic)
        # One look at a time per topic: one that hangs (a frozen broker) is waited out.
        if look is None or (look[1].done() and monotonic_s() - look[0] > self._fresh_s):
            look = (monotonic_s(), asyncio.create_task(self._describe(topic)))
            look[1].add_done_callback(_retrieved)
            self._looks[topic] = look
        try:
            return await asyncio.wait_for(asyncio.shield(look[1]), DESCRIBE_TIMEOUT_S)
        except (KafkaError, OSError, TimeoutError, ValueError):
            return None


async def acknowledged(
    ack: Awaitable[T],
    *,
    what: str,
    timeout_s: float,
    problem: Callable[[], Awaitable[str | None]],
    check_after_s: float = CHECK_AFTER_S,
) -> T:
    """``await ack`` for at most ``timeout_s``; NotEnoughReplicas as soon as ``problem`` names one.

    Past the timeout, PublishError. Either way the write may still land later (the producer keeps
    it), so the messages say it is not acknowledged, not that it is lost or refused for good.
    """
    future = asyncio.ensure_future(ack)
    try:
        return await _within(future, what, timeout_s, problem, check_after_s)
    except BaseException:
        # Abandoned (timed out, refused, or the caller cancelled): the producer may still
        # settle the ack later, and nobody waits for it any more.
        future.add_done_callback(_retrieved)
        raise


async def _within(
    future: asyncio.Future[T],
    what: str,
    timeout_s: float,
    problem: Callable[[], Awaitable[str | None]],
    check_after_s: float,
) -> T:
    deadline = monotonic_s() + timeout_s
    while True:
        left = deadline - monotonic_s()
        if await _settled(future, max(0.0, min(check_after_s, left))):
            return future.result()
        if left <= check_after_s:
            raise not_acknowledged(what, timeout_s)
        try:  # the look must not outlast the bound either (the producer's metadata may stall)
            cause = await asyncio.wait_for(problem(), max(0.0, deadline - monotonic_s()))
        except TimeoutError:
            cause = None
        if cause is not None:
            raise refused(what, cause)


def not_acknowledged(what: str, timeout_s: float) -> PublishError:
    """The error of a write whose ack did not come within ``timeout_s``."""
    return PublishError(
        f"{what}: not acknowledged within {timeout_s:g} s (the broker may be slow or down); it "
        "may still be written: retry with an idempotency key to be safe"
    )


def refused(what: str, cause: str) -> NotEnoughReplicas:
    """The error of a write whose partition cannot take it now, for ``cause``."""
    return NotEnoughReplicas(
        f"{what}: not acknowledged: {cause}; retry once the brokers are back (it may still be "
        "written then: use an idempotency key to be safe)"
    )


async def _settled(future: asyncio.Future[Any], timeout_s: float) -> bool:
    """Whether ``future`` is done within ``timeout_s``; it is never cancelled.

    ``asyncio.wait({future}, timeout=...)`` without its sets and per-call task bookkeeping: this
    runs once per append, and an ack usually comes within the first wait.
    """
    if future.done():
        return True
    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = loop.call_later(timeout_s, wake)
    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        future.remove_done_callback(wake)
    return future.done()


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Marks an abandoned ack's outcome as seen (no 'exception was never retrieved')."""
    if not future.cancelled():
        with contextlib.suppress(BaseException):
            future.exception()
