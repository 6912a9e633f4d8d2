"""Failure detail: the category a failed attempt is counted under, and bounded tracebacks.

Categories are actionable buckets (retry later, fix the code, raise the timeout, ...): the
built-in ones below, or a name an app maps exception classes to. The fold refuses a category
that is not a short snake_case name, which keeps metric labels few and safe.
"""

from __future__ import annotations

import re

from evsched.core.state import JobError

TRANSIENT = "transient"
PERMANENT = "permanent"
TIMEOUT = "timeout"
CANCELLED = "cancelled"
LOST_WORKER = "lost_worker"
SNOOZE_LIMIT = "snooze_limit"  # a snooze past the task's cap (core.snooze)
BUILTIN_CATEGORIES = (TRANSIENT, PERMANENT, TIMEOUT, CANCELLED, LOST_WORKER, SNOOZE_LIMIT)

MAX_CATEGORY_CHARS = 32
CATEGORY_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")
# A traceback kept with a failed attempt: at most this many characters, cut in the middle.
MAX_TRACEBACK_CHARS = 16 * 1024
CUT_MARKER = "\n... [{cut} characters cut] ...\n"

# Error types the engine itself reports, with the category they mean.
_ENGINE_ERRORS = {"LeaseExpired": LOST_WORKER, "TimeoutError": TIMEOUT}


def category_of(error: JobError) -> str:
    """The category of a failure: the one it was reported with, else derived from its type.

    Failures written before categories existed (and lease expiries, which the node reports)
    carry none: an expired lease is a lost worker, a timeout a timeout, and the rest transient
    or permanent by whether they may be retried.
    """
    if error.category is not None:
        return error.category
    derived = _ENGINE_ERRORS.get(error.error_type)
    if derived is not None:
        return derived
    return TRANSIENT if error.retryable else PERMANENT


def category_refusal(category: str) -> str | None:
    """Why ``category`` cannot name a failure category, or None."""
    if not isinstance(category, str) or not CATEGORY_PATTERN.fullmatch(category):
        shown = repr(category) if len(repr(category)) <= 40 else f"{repr(category)[:37]}..."
        return (
            f"category {shown} must be snake_case [a-z][a-z0-9_]* of at most "
            f"{MAX_CATEGORY_CHARS} characters"
        )
    return None


def truncate_middle(text: str, limit: int = MAX_TRACEBACK_CHARS) -> str:
    """``text`` if it fits in ``limit`` characters, else its head and tail around a marker.

    A traceback's head says where the job began and its tail where it failed: both are kept.
    """
    if len(text) <= limit:
        return text
    marker = CUT_MARKER.format(cut=len(text))  # long enough for the true count below
    keep = max(0, limit - len(marker))
    head, tail = keep // 2, keep - keep // 2
    cut = len(text) - head - tail
    marker = CUT_MARKER.format(cut=cut)
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")
