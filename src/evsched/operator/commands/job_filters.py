"""Jobs of the local replica filtered by status, queue, task and failure category, and the
options the job-listing commands share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import typer

from evsched.core.failures import category_of
from evsched.core.state import JobState, Status
from evsched.operator.replica_dir import LocalIndex

QueueFilter = Annotated[str | None, typer.Option("--queue", help="Only jobs of this queue.")]
TaskFilter = Annotated[str | None, typer.Option("--task", help="Only jobs of this task.")]
Limit = Annotated[int, typer.Option("--limit", min=1, help="At most this many jobs.")]


def find_jobs(
    local: LocalIndex,
    *,
    status: Status | None = None,
    queue: str | None = None,
    task: str | None = None,
    limit: int | None = None,
    category: str | None = None,
) -> list[JobState]:
    """Jobs matching every filter given, in id order per partition, stopping at ``limit``."""
    found: list[JobState] = []
    for state in _all_jobs(local):
        if status is not None and state.status is not status:
            continue
        if category is not None and category != failure_category(state):
            continue
        if (queue is not None and state.queue != queue) or (
            task is not None and state.task != task
        ):
            continue
        found.append(state)
        if limit is not None and len(found) >= limit:
            break
    return found


def failure_category(state: JobState) -> str | None:
    return None if state.last_error is None else category_of(state.last_error)


def _all_jobs(local: LocalIndex) -> Iterator[JobState]:
    for _, index in sorted(local.indexes.items()):
        yield from index.jobs()
