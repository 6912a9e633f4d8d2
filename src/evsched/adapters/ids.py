"""Mints the random ids of jobs and events at the edge; the core takes ids as parameters."""

from __future__ import annotations

import uuid


def new_id() -> str:
    """A random UUID string: ids of jobs without an idempotency key, and of events."""
    return str(uuid.uuid4())  # noqa: TID251 - ids are generated at the edge, here
