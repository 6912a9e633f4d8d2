"""A handler's Snooze, returned or raised, is reported as an AttemptSnoozed under its token."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest

from evsched.client import Snooze
from evsched.client.snooze import DEFAULT_MAX_SNOOZES
from evsched.core.bounds import MAX_SNOOZE_MS, MAX_SNOOZE_REASON_BYTES, MAX_SNOOZES
from evsched.core.events import AttemptFailed, AttemptSnoozed, AttemptSucceeded
from evsched.errors import InvalidTask
from tests.unit.worker_rig import Rig, make_rig


@pytest.fixture
def rig() -> Rig:
    return make_rig()


async def test_a_raised_snooze_is_reported_with_its_delay_reason_token_and_the_default_cap(
    rig: Rig,
) -> None:
    @rig.app.task(name="raises")
    async def raises() -> None:
        raise Snooze(2.5, reason="upstream said 429")

    sent = rig.send("raises")
    async with rig.worker(concurrency=1):
        snoozed = await rig.outcome(sent.job_id)
    assert isinstance(snoozed, AttemptSnoozed)
    assert (snoozed.token, snoozed.delay_ms, snoozed.reason) == (
        sent.token, 2_500, "upstream said 429",
    )  # fmt: skip
    assert snoozed.max_snoozes == DEFAULT_MAX_SNOOZES == 25
    assert snoozed.source == "worker-w1"


async def test_a_returned_snooze_of_a_sync_handler_carries_its_tasks_cap(rig: Rig) -> None:
    @rig.app.task(name="returns", max_snoozes=3)
    def returns() -> Snooze:
        return Snooze(timedelta(minutes=1))

    @rig.app.task(name="plain")
    def plain() -> int:
        return 1

    sent, after = rig.send("returns"), rig.send("plain")
    async with rig.worker(concurrency=1):
        snoozed = await rig.outcome(sent.job_id)
        assert isinstance(await rig.outcome(after.job_id), AttemptSucceeded)
    assert isinstance(snoozed, AttemptSnoozed)
    assert (snoozed.delay_ms, snoozed.max_snoozes, snoozed.reason) == (60_000, 3, "")


async def test_a_snooze_a_handler_cannot_make_fails_the_attempt_as_its_error(rig: Rig) -> None:
    @rig.app.task(name="negative")
    async def negative() -> None:
        raise Snooze(-1)

    sent = rig.send("negative")
    async with rig.worker(concurrency=1):
        failed = await rig.outcome(sent.job_id)
    assert isinstance(failed, AttemptFailed)
    assert failed.error_type == "ValueError"
    assert "outside [0, 2592000]" in failed.message


@pytest.mark.parametrize(
    "seconds",
    [-0.001, math.nan, math.inf, MAX_SNOOZE_MS / 1000 + 0.001, True, "5"],
)
def test_a_snooze_refuses_a_delay_it_cannot_report(seconds: object) -> None:
    with pytest.raises(ValueError, match="Snooze seconds"):
        Snooze(seconds)  # type: ignore[arg-type]


def test_a_snooze_rounds_up_to_a_millisecond_and_cuts_a_long_reason() -> None:
    assert Snooze(0.0001).delay_ms == 1
    assert Snooze(0).delay_ms == 0
    assert Snooze(MAX_SNOOZE_MS / 1000).delay_ms == MAX_SNOOZE_MS
    long = Snooze(1, reason="é" * MAX_SNOOZE_REASON_BYTES)
    assert len(long.reason.encode()) <= MAX_SNOOZE_REASON_BYTES
    assert long.reason == "é" * (MAX_SNOOZE_REASON_BYTES // 2)
    with pytest.raises(ValueError, match="reason must be a string"):
        Snooze(1, reason=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("cap", [-1, MAX_SNOOZES + 1, 2.0, True])
def test_a_task_refuses_a_cap_outside_its_bounds_naming_the_field(rig: Rig, cap: object) -> None:
    with pytest.raises(InvalidTask) as raised:
        rig.app.task(name="bad", max_snoozes=cap)(lambda: None)  # type: ignore[arg-type]
    assert raised.value.field == "max_snoozes"
