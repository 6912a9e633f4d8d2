"""Retry policy: exponential backoff with a cap and jitter derived from (job id, attempt)."""

from __future__ import annotations

import hashlib

from evsched.core.events import RetryPolicy


def jitter_unit(job_id: str, attempt: int) -> float:
    """A number in [0, 1) that is the same for the same (job id, attempt) on every machine."""
    digest = hashlib.blake2b(f"{job_id}\x00{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def backoff_ms(policy: RetryPolicy, job_id: str, attempt: int) -> int:
    """Delay before the attempt after ``attempt`` (1-based): ``initial * multiplier**(attempt-1)``.

    The delay is capped at ``max_backoff_ms``; ``jitter`` removes up to that fraction of it, so
    retries of many jobs failing together spread out instead of arriving in a herd.
    """
    cap = max(0, policy.max_backoff_ms)
    delay = float(max(0, policy.initial_backoff_ms))
    multiplier = max(1.0, policy.multiplier)
    for _ in range(max(0, attempt - 1)):
        if delay >= cap:
            break
        delay *= multiplier
    delay = min(delay, float(cap))
    jitter = min(1.0, max(0.0, policy.jitter))
    return int(delay * (1.0 - jitter * jitter_unit(job_id, attempt)))


def may_retry(*, attempt: int, max_attempts: int, retryable: bool) -> bool:
    return retryable and attempt < max_attempts
