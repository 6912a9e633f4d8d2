"""PerLoop: one client per event loop, started once, never shared with another running loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from evsched.client.per_loop import PerLoop
from evsched.errors import EvschedError


class _Client:
    def __init__(self, fail: BaseException | None = None, delay_s: float = 0.0) -> None:
        self.fail = fail
        self.delay_s = delay_s
        self.started = 0
        self.closed = 0

    async def start(self) -> None:
        self.started += 1
        await asyncio.sleep(self.delay_s)
        if self.fail is not None:
            raise self.fail

    async def close(self) -> None:
        self.closed += 1


def _holder(*clients: _Client) -> tuple[PerLoop[_Client], list[_Client]]:
    made: list[_Client] = []
    pending = list(clients)

    def factory() -> _Client:
        made.append(pending.pop(0) if pending else _Client())
        return made[-1]

    return PerLoop(factory), made


async def test_callers_of_one_loop_share_one_client_started_once() -> None:
    holder, made = _holder(_Client(delay_s=0.01))

    first, second = await asyncio.gather(holder.get(), holder.get())

    assert first is second is made[0]
    assert len(made) == 1 and made[0].started == 1
    await holder.close()
    assert made[0].closed == 1
    assert await holder.get() is made[1]  # closed: the next call makes a new one


async def test_a_failed_start_is_closed_and_the_next_call_retries() -> None:
    holder, made = _holder(_Client(fail=EvschedError("no broker")))

    with pytest.raises(EvschedError, match="no broker"):
        await holder.get()

    assert made[0].closed == 1
    assert await holder.get() is made[1]


async def test_a_caller_cancelled_while_starting_closes_the_client() -> None:
    holder, made = _holder(_Client(delay_s=10.0))

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await holder.get()

    assert made[0].closed == 1
    assert await holder.get() is made[1]


def test_a_closed_loop_s_client_is_replaced() -> None:
    holder, made = _holder()

    asyncio.run(holder.get())
    asyncio.run(holder.get())

    assert len(made) == 2


async def test_another_running_loop_is_refused() -> None:
    holder, _ = _holder()
    await holder.get()
    errors: list[BaseException] = []

    def other_loop() -> None:
        try:
            asyncio.run(holder.get())
        except EvschedError as exc:
            errors.append(exc)

    thread = threading.Thread(target=other_loop)
    thread.start()
    await asyncio.to_thread(thread.join)
    assert len(errors) == 1 and "another running event loop" in str(errors[0])
