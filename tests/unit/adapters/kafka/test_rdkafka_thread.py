"""The group member's thread: calls in order on one thread, queued calls made before the next."""

from __future__ import annotations

import asyncio
import threading

import pytest

from evsched.adapters.kafka.rdkafka_thread import ConsumerThread


async def test_calls_run_in_order_on_one_thread_and_queued_calls_go_first() -> None:
    thread = ConsumerThread("test-consumer")
    seen: list[tuple[str, str]] = []

    def note(what: str) -> None:
        seen.append((what, threading.current_thread().name))

    blocker = threading.Event()
    first = asyncio.ensure_future(thread.call(lambda: blocker.wait(5)))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(thread.call(lambda: note("call")))
    thread.later(lambda: note("later"))  # asked after the call, made before it: never waited for
    blocker.set()
    assert await first is True
    await second
    assert seen == [("later", "test-consumer"), ("call", "test-consumer")]
    thread.stop()
    assert await asyncio.to_thread(thread.join, 5)


async def test_a_failing_queued_call_is_skipped_and_a_failing_call_raises_to_its_caller() -> None:
    thread = ConsumerThread("test-consumer")
    made: list[int] = []

    def refused() -> None:
        raise RuntimeError("partition revoked meanwhile")

    thread.later(refused)
    thread.later(lambda: made.append(1))
    with pytest.raises(ValueError, match="boom"):
        await thread.call(lambda: (_ for _ in ()).throw(ValueError("boom")))
    assert made == [1]
    assert await thread.call(lambda: 7) == 7
    thread.stop()
    assert await asyncio.to_thread(thread.join, 5)
    with pytest.raises(RuntimeError, match="stopped"):
        await thread.call(lambda: 1)


async def test_run_later_is_refused_off_the_thread() -> None:
    thread = ConsumerThread("test-consumer")
    with pytest.raises(AssertionError):
        thread.run_later()
    assert await thread.call(thread.on_thread) is True
    assert not thread.on_thread()
    thread.stop()
    assert await asyncio.to_thread(thread.join, 5)
