"""The worker's cheaper per-attempt machinery: mailboxes between loops, and delayed tasks."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from evsched.runtime.worker.handoff import Mailbox
from evsched.runtime.worker.later import LaterTask


async def test_calls_from_another_thread_run_in_order_one_wake_up_per_burst() -> None:
    loop = asyncio.get_running_loop()
    mailbox = Mailbox(loop)
    seen: list[int] = []
    wakes = 0
    drain = mailbox._drain

    def counted() -> None:
        nonlocal wakes
        wakes += 1
        drain()

    mailbox._drain = counted  # type: ignore[method-assign]
    done = asyncio.Event()

    def post_burst() -> None:
        for i in range(500):
            mailbox.post(lambda i=i: seen.append(i))
        mailbox.post(done.set)

    # Posted while the loop is busy (here: joining the thread): one wake-up takes them all.
    thread = threading.Thread(target=post_burst)
    thread.start()
    thread.join()
    await asyncio.wait_for(done.wait(), 5)
    assert seen == list(range(500))
    assert wakes == 1


async def test_a_call_posted_while_draining_is_not_lost() -> None:
    mailbox = Mailbox(asyncio.get_running_loop())
    seen: list[str] = []
    mailbox.post(lambda: mailbox.post(lambda: seen.append("second")))
    mailbox.post(lambda: seen.append("first"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert seen == ["first", "second"]


async def test_a_failing_call_is_reported_and_the_others_still_run() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    mailbox = Mailbox(loop)
    seen: list[int] = []
    mailbox.post(lambda: 1 / 0)
    mailbox.post(lambda: seen.append(2))
    for _ in range(3):
        await asyncio.sleep(0)
    loop.set_exception_handler(None)
    assert seen == [2]
    assert isinstance(reported[0]["exception"], ZeroDivisionError)


def test_posting_to_a_closed_loop_is_dropped() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    Mailbox(loop).post(lambda: None)  # no RuntimeError from a handler thread at shutdown


async def test_a_later_task_stopped_before_its_delay_never_runs() -> None:
    ran: list[str] = []

    async def body() -> None:
        ran.append("ran")

    later = LaterTask(0.05, body, "t")
    await later.stop()
    await asyncio.sleep(0.1)
    assert ran == []
    assert not later.started


async def test_a_later_task_runs_after_its_delay_in_the_context_it_was_made_in() -> None:
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    seen: list[str] = []
    var.set("made")

    async def body() -> None:
        seen.append(var.get())
        await asyncio.sleep(10)

    later = LaterTask(0.01, body, "t")
    var.set("changed")
    await asyncio.sleep(0.05)
    assert later.started
    await later.stop()  # cancels the sleeping task and waits for it
    assert seen == ["made"]


async def test_stopping_a_later_task_raises_what_it_raised() -> None:
    async def body() -> None:
        raise ValueError("boom")

    later = LaterTask(0, body, "t")
    await asyncio.sleep(0.02)
    with pytest.raises(ValueError, match="boom"):
        await later.stop()


async def test_a_call_posted_from_a_loop_that_then_blocks_still_runs_on_its_target() -> None:
    # A handler's end is posted from the handler loop; the next callback there may be another
    # handler that blocks. The end must reach the worker's loop all the same.
    target = asyncio.new_event_loop()
    thread = threading.Thread(target=target.run_forever, daemon=True)
    thread.start()
    try:
        mailbox = Mailbox(target)
        ran = threading.Event()
        mailbox.post(ran.set)
        # This loop blocks (no await), as a blocking handler would, until the call ran there.
        assert ran.wait(2)
    finally:
        target.call_soon_threadsafe(target.stop)
        thread.join(5)
        target.close()
