"""An example evsched app: a few tasks to try the worker with, and a script that enqueues them.

Run a worker:   evsched worker --app examples.app:app
Enqueue jobs:   python -m examples.app
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from evsched.client import App, Context, RetryPolicy

app = App(name="example")


@app.task(name="example.noop")
async def noop() -> None:
    """Does nothing: the smallest round trip through the scheduler."""


@app.task(name="example.send_receipt", queue="default", max_attempts=5)
async def send_receipt(ctx: Context, order_id: str, email: str) -> dict[str, str]:
    """Records an email as an effect, published once and only if this attempt's success counts."""
    ctx.effect("email.send", {"to": email, "template": "receipt", "order": order_id}, key=order_id)
    return {"order": order_id, "status": "receipt queued"}


@app.task(
    name="example.flaky",
    max_attempts=5,
    retry=RetryPolicy(initial_backoff_ms=200, max_backoff_ms=2_000),
    retry_on=(ConnectionError,),
    permanent_on=(ValueError,),
)
async def flaky(ctx: Context, failures: int) -> str:
    """Fails with a retryable error on its first ``failures`` attempts, then succeeds."""
    if failures < 0:
        raise ValueError("failures must be >= 0")  # permanent: retrying would not help
    if ctx.attempt <= failures:
        raise ConnectionError(f"upstream unavailable (attempt {ctx.attempt} of {ctx.max_attempts})")
    return f"succeeded on attempt {ctx.attempt}"


@app.task(name="example.count_to", timeout_s=60)
async def count_to(ctx: Context, n: int) -> int:
    """Counts to ``n`` saving a checkpoint at each step; a re-run resumes where the last one was."""
    done = int(ctx.last_checkpoint or 0)
    for step in range(done + 1, n + 1):
        await asyncio.sleep(0.2)  # stands in for a slice of real work
        if not await ctx.is_current():
            ctx.log.warning("lease_lost_stopping", step=step)
            raise ConnectionError("lost the lease; a new attempt resumes from the checkpoint")
        await ctx.checkpoint(step)
    return n


@app.task(name="example.resize", queue="default")
def resize(path: str, width: int) -> str:
    """A sync handler: it runs in the worker's thread pool."""
    return f"{path}@{width}w"


def main() -> None:
    with app:
        print("noop", noop.enqueue_sync())
        print("receipt", send_receipt.enqueue_sync("A-1", "buyer@example.com"))
        print("flaky", flaky.enqueue_sync(2))
        print("count_to", count_to.options(idempotency_key="count-once").enqueue_sync(10))
        print("resize", resize.options(delay=timedelta(seconds=5)).enqueue_sync("a.png", 640))


if __name__ == "__main__":
    main()
