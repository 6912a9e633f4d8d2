"""The parents' results a waiting job keeps stay within ``bounds.MAX_RESULTS_BYTES`` (fold version
5): before it, a callback over 1,000 parents returning 8 kB each grew a state larger than a
changelog record, which the broker refused, failing every step of the callback's partition."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsched.adapters.kafka.topics import STATE_MAX_MESSAGE_BYTES
from evsched.core import bounds
from evsched.core.events import ParentResolved
from evsched.core.state import Status, Verdict
from evsched.testing import NodeDriver
from tests.unit.core.workflow.test_workflows import enqueue, resolve, run
from tests.unit.runtime.driver.test_node_driver_workflows import BUDGETS, child

# Kafka's default max.message.bytes, which the events and dispatch topics keep.
EVENT_MAX_BYTES = 1_048_588


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(bounds, "MAX_RESULTS_BYTES", 10)
    return 10


def test_a_job_to_get_results_past_the_limit_is_cancelled_and_keeps_none(small: int) -> None:
    state, entries = run(
        enqueue("c", "a", "b", "d", results_to_args="list"),
        resolve("c", "a", result=b"12345"),
        resolve("c", "b", result=b"123456"),  # 11 bytes together: past the limit
    )
    assert state is not None and state.status is Status.CANCELLED
    assert entries[-1].verdict is Verdict.APPLIED
    assert entries[-1].reason == (
        f"parent b succeeded at 2@9: the parents' results exceed {small} bytes, cancelled"
    )
    assert [r.result for r in state.resolutions] == [b"12345", None]
    state, entries = run(resolve("c", "d", result=b"1"), state=state)  # recorded, nothing more
    assert state is not None and [r.result for r in state.resolutions] == [b"12345", None, b"1"]
    assert "recorded (job is already cancelled)" in entries[-1].reason


def test_a_job_that_takes_no_results_is_released_with_the_extra_ones_dropped(small: int) -> None:
    state, entries = run(
        enqueue("c", "a", "b"),
        resolve("c", "a", result=b"1234567890"),
        resolve("c", "b", result=b"1"),
    )
    assert state is not None and state.status is Status.SCHEDULED
    assert entries[-1].reason.endswith("rule all_succeeded met, released")
    assert [r.result for r in state.resolutions] == [b"1234567890", None]
    assert state.args == b'{"args":[0],"kwargs":{}}'


def test_results_within_the_limit_pass_as_before(small: int) -> None:
    state, _ = run(
        enqueue("c", "a", "b", results_to_args="list"),
        resolve("c", "a", result=b"12345"),
        resolve("c", "b", result=b"67890"),  # exactly the limit
    )
    assert state is not None and state.status is Status.SCHEDULED
    assert state.args == b'{"args":[0,[12345,67890]],"kwargs":{}}'


def resolution(i: int, parent: str, result: bytes) -> ParentResolved:
    return ParentResolved(
        event_id=f"r{i}", job_id="cb", emitted_at=0, source="node-x", parent_id=parent,
        outcome="succeeded", parent_partition=1, parent_offset=i, result=result,
    )  # fmt: skip


async def test_a_callback_over_1000_parents_with_8kb_results_never_stops_its_partition(
    tmp_path: Path,
) -> None:
    driver = NodeDriver(tmp_path, budgets=BUDGETS)
    driver.broker.max_message_bytes[driver.topics.state] = STATE_MAX_MESSAGE_BYTES
    driver.broker.max_message_bytes[driver.topics.events] = EVENT_MAX_BYTES
    parents = [f"p{i:04d}" for i in range(1_000)]
    driver.append(child("cb", *parents, place="list"), child("after", "p0000"))
    await driver.settle()
    result = b'"' + b"x" * 8_000 + b'"'
    for i, parent in enumerate(parents):
        driver.append(resolution(i, parent, result))
        if i % 100 == 99:
            await driver.settle()  # before fold version 5: RecordRefused, from p~520 on
    state = driver.job("cb")
    assert state is not None and state.status is Status.CANCELLED
    assert len(state.resolutions) == 1_000
    kept = sum(len(r.result or b"") for r in state.resolutions)
    assert kept <= bounds.MAX_RESULTS_BYTES < kept + len(result)
    cancelled = [e for e in driver.job_timeline("cb") if e.status_after is Status.CANCELLED]
    assert "the parents' results exceed" in cancelled[0].reason
    assert max(len(r.value or b"") for r in driver.changelog()) <= STATE_MAX_MESSAGE_BYTES
    # The partition goes on: another job on it still waits, then runs when its parent ends.
    assert driver.job("after") is not None
    assert driver.owner.index.applied_offset() == driver.log()[-1].offset
