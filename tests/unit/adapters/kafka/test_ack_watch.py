"""AckWatch, the librdkafka EventLog's ack bound, with no broker (acks are futures, the cluster a
function): an ack that comes is untouched; one whose partition lacks replicas fails with the cause
named once it is overdue, and is reported as refused; one due while a look runs is looked at
when it ends; one that is only slow fails at the timeout; a look that hangs or breaks names no
cause; a closed watch fails nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

from evsched.adapters.kafka import ack_watch
from evsched.adapters.kafka.ack_watch import AckWatch
from evsched.errors import NotEnoughReplicas, PublishError

TOPIC = "ns.events"
SHORT = "partition 0 of 'ns.events' has 1 in-sync replica(s) [1], fewer than its min ISR"


class Cluster:
    """The look AckWatch makes: a cause per key (None: healthy), and who was asked."""

    def __init__(self, cause: str | None = None, *, hang: bool = False, fail: bool = False):
        self.cause, self.hang, self.fail = cause, hang, fail
        self.asked: list[tuple[str, list[str]]] = []

    async def problems(self, topic: str, keys: list[str]) -> list[str | None]:
        self.asked.append((topic, keys))
        if self.fail:
            raise OSError("the cluster cannot be asked")
        if self.hang:
            await asyncio.sleep(3600)
        return [self.cause for _ in keys]


def pending() -> asyncio.Future[str]:
    return asyncio.get_running_loop().create_future()


async def test_an_ack_that_comes_is_left_alone_and_nobody_is_asked() -> None:
    cluster = Cluster(SHORT)
    watch = AckWatch(cluster.problems, timeout_s=5, check_after_s=0.05)
    ack = pending()
    watch.watch(ack, TOPIC, "job-1")
    asyncio.get_running_loop().call_later(0.01, ack.set_result, "acked")
    assert await ack == "acked"
    await asyncio.sleep(0.15)  # past the check: the settled ack is dropped, not looked at
    assert cluster.asked == []
    watch.close()


async def test_an_overdue_ack_on_a_short_partition_is_refused_with_its_cause() -> None:
    cluster = Cluster(SHORT)
    refused: list[asyncio.Future[str]] = []
    watch = AckWatch(cluster.problems, timeout_s=5, check_after_s=0.05, on_refused=refused.append)
    acks = [pending() for _ in range(3)]
    for i, ack in enumerate(acks):
        watch.watch(ack, TOPIC, f"job-{i}")
    started = time.monotonic()
    for ack in acks:
        with pytest.raises(NotEnoughReplicas, match=r"writing to 'ns.events': not ack.*min ISR"):
            await ack
    assert time.monotonic() - started < 2  # at the first look, not at the timeout
    assert refused == acks
    assert cluster.asked == [(TOPIC, ["job-0", "job-1", "job-2"])]  # one look for the three
    watch.close()


class HeldCluster(Cluster):
    """A cluster whose first look is answered only when the test says so."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.release = asyncio.Event()

    async def problems(self, topic: str, keys: list[str]) -> list[str | None]:
        if not self.asked:
            self.asked.append((topic, keys))
            await self.release.wait()
            return [self.cause for _ in keys]
        return await super().problems(topic, keys)


async def test_an_ack_due_during_a_look_is_looked_at_when_it_ends_not_a_check_later() -> None:
    # A look that runs long (a slow describe) used to push the acks that fell due meanwhile back
    # by a whole check period, again at each tick that found a look running: a busy watch put
    # some acks off for 20 s and more.
    check_after_s = 1.0
    cluster = HeldCluster(SHORT)
    watch = AckWatch(cluster.problems, timeout_s=30, check_after_s=check_after_s)
    first, second = pending(), pending()
    watch.watch(first, TOPIC, "job-1")

    async def first_looked_at() -> None:
        while not cluster.asked:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(first_looked_at(), 5)
    loop = asyncio.get_running_loop()
    watch.watch(second, TOPIC, "job-2")
    # The second ack's look falls due while the first look still runs; no event marks the
    # moment, so wait for the clock to pass it (and a few ticks more).
    await asyncio.sleep(check_after_s + 4 * ack_watch.TICK_S)
    assert not second.done()
    released = loop.time()
    cluster.release.set()
    for ack in (first, second):
        with pytest.raises(NotEnoughReplicas, match="min ISR"):
            await asyncio.wait_for(ack, 5)
    assert loop.time() - released < check_after_s / 2  # at once, not a check period later
    assert cluster.asked == [(TOPIC, ["job-1"]), (TOPIC, ["job-2"])]
    watch.close()


async def test_a_slow_ack_on_a_healthy_partition_fails_at_the_timeout() -> None:
    cluster = Cluster(None)
    watch = AckWatch(cluster.problems, timeout_s=0.4, check_after_s=0.1)
    ack = pending()
    started = time.monotonic()
    watch.watch(ack, TOPIC, "job-1")
    with pytest.raises(PublishError, match=r"not acknowledged within 0\.4 s") as failed:
        await ack
    assert not isinstance(failed.value, NotEnoughReplicas)
    assert 0.4 <= time.monotonic() - started < 0.4 + 10 * ack_watch.TICK_S
    assert len(cluster.asked) >= 2  # looked at again while it waited
    watch.close()


@pytest.mark.parametrize("cluster", [Cluster(hang=True), Cluster(fail=True)], ids=["hang", "fail"])
async def test_a_look_that_hangs_or_fails_names_no_cause_and_the_timeout_holds(
    cluster: Cluster,
) -> None:
    watch = AckWatch(cluster.problems, timeout_s=0.3, check_after_s=0.05)
    ack = pending()
    watch.watch(ack, TOPIC, "job-1")
    with pytest.raises(PublishError, match="not acknowledged within") as failed:
        await ack
    assert not isinstance(failed.value, NotEnoughReplicas)
    watch.close()


async def test_a_closed_watch_fails_nothing() -> None:
    watch = AckWatch(Cluster(SHORT).problems, timeout_s=0.1, check_after_s=0.05)
    ack = pending()
    watch.watch(ack, TOPIC, "job-1")
    watch.close()
    await asyncio.sleep(0.3)
    assert not ack.done()
