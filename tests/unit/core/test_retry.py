"""Backoff: exponential growth, cap, jitter bounds and determinism; the retry decision."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evsched.core.events import RetryPolicy
from evsched.core.retry import backoff_ms, jitter_unit, may_retry

EXACT = RetryPolicy(initial_backoff_ms=1_000, max_backoff_ms=60_000, multiplier=2.0, jitter=0.0)


def test_backoff_doubles_per_attempt_until_the_cap() -> None:
    delays = [backoff_ms(EXACT, "job", attempt) for attempt in range(1, 10)]
    assert delays == [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000]


def test_backoff_for_huge_attempt_numbers_stays_at_the_cap() -> None:
    assert backoff_ms(EXACT, "job", 10_000) == 60_000


def test_backoff_with_other_multiplier() -> None:
    policy = RetryPolicy(initial_backoff_ms=100, max_backoff_ms=10**6, multiplier=3.0, jitter=0)
    assert [backoff_ms(policy, "j", a) for a in (1, 2, 3, 4)] == [100, 300, 900, 2_700]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (RetryPolicy(initial_backoff_ms=-5, jitter=0.0), 0),
        (RetryPolicy(initial_backoff_ms=500, multiplier=0.5, jitter=0.0), 500),
        (RetryPolicy(initial_backoff_ms=500, max_backoff_ms=-1, jitter=0.0), 0),
        (RetryPolicy(initial_backoff_ms=500, max_backoff_ms=200, jitter=0.0), 200),
        (RetryPolicy(initial_backoff_ms=500, jitter=-3.0), 500),
    ],
)
def test_nonsense_policies_are_clamped_not_crashing(policy: RetryPolicy, expected: int) -> None:
    assert backoff_ms(policy, "j", 3 if policy.multiplier < 1 else 1) == expected


def test_full_jitter_stays_within_zero_and_the_delay() -> None:
    policy = RetryPolicy(initial_backoff_ms=1_000, jitter=5.0)  # clamped to 1.0
    delays = {backoff_ms(policy, f"job-{i}", 1) for i in range(200)}
    assert min(delays) >= 0
    assert max(delays) <= 1_000
    assert len(delays) > 150  # spread out, not a herd


def test_jitter_is_deterministic_per_job_and_attempt() -> None:
    policy = RetryPolicy(jitter=0.5)
    assert backoff_ms(policy, "a", 2) == backoff_ms(policy, "a", 2)
    assert jitter_unit("a", 2) == jitter_unit("a", 2)
    assert jitter_unit("a", 2) != jitter_unit("a", 3)
    assert jitter_unit("a", 2) != jitter_unit("b", 2)
    # Pinned: a change to the hash would change every replayed run_at.
    assert jitter_unit("job-1", 1) == 0.29014047510758467


POLICIES = st.builds(
    RetryPolicy,
    initial_backoff_ms=st.integers(0, 10**7),
    max_backoff_ms=st.integers(0, 10**8),
    multiplier=st.floats(1.0, 10.0),
    jitter=st.floats(0.0, 1.0),
)


@settings(max_examples=200, deadline=None)
@given(policy=POLICIES, attempt=st.integers(1, 200), job_id=st.text(max_size=20))
def test_backoff_is_within_jitter_bounds_of_the_capped_exponential(
    policy: RetryPolicy, attempt: int, job_id: str
) -> None:
    growth = policy.multiplier ** (attempt - 1)  # at most 10**199: no float overflow
    ceiling = min(float(policy.max_backoff_ms), policy.initial_backoff_ms * growth)
    delay = backoff_ms(policy, job_id, attempt)
    slack = 1 + 1e-9 * ceiling  # float rounding of the repeated multiplication
    assert 0 <= delay <= ceiling + slack
    assert delay >= ceiling * (1 - policy.jitter) - slack
    assert 0.0 <= jitter_unit(job_id, attempt) < 1.0


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "retryable", "expected"),
    [(1, 3, True, True), (2, 3, True, True), (3, 3, True, False), (1, 3, False, False)],
)
def test_may_retry(attempt: int, max_attempts: int, retryable: bool, expected: bool) -> None:
    assert may_retry(attempt=attempt, max_attempts=max_attempts, retryable=retryable) is expected
