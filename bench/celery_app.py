"""The Celery app of the side-by-side benchmark: the same timed no-op, on Redis.

Configured as the issue's comparison was: late acknowledgement, a prefork pool (its size is the
worker's ``--concurrency``), no result backend. Delayed jobs are ETA tasks, which the worker holds
in memory until they are due. ``BENCH_REDIS_URL`` names the Redis the bench started.
"""

from __future__ import annotations

import os

from celery import Celery

from starts import record

QUEUE = "bench"

app = Celery("bench", broker=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:19850/0"))
app.conf.update(
    task_acks_late=True,
    task_ignore_result=True,
    task_default_queue=QUEUE,
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(name="bench.timed_noop")
def timed_noop(tag: str, run_at_ms: int) -> None:
    """Does nothing but note when it started, as evsched's twin does."""
    record(tag, run_at_ms)
