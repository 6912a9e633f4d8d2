"""Tasks for the follow scenarios (cancel reaching running code, results, reruns, failure detail),
run by real worker processes (``--app tests.integration.follow_app:app``).

Handlers leave marker files in a directory the test names, so a test can tell what a process did
without sleeping on guesses.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from evsched.client import App, Context, RetryPolicy
from evsched.settings import Settings

FAST_RETRY = RetryPolicy(initial_backoff_ms=200, max_backoff_ms=500, multiplier=2.0, jitter=0.0)
STEP_S = 0.1


class BillingDown(Exception):
    """A business failure the app maps to its own category."""


def make_app(settings: Settings | None = None) -> App:
    app = App(settings, name="follow", failure_categories={BillingDown: "billing_api"})

    @app.task(name="f.count", timeout_s=300)
    async def count(ctx: Context, marks: str, n: int) -> int:
        """Counts to ``n``, a checkpoint per step; notes when it is cancelled."""
        folder = Path(marks)
        try:
            for step in range(1, n + 1):
                await asyncio.sleep(STEP_S)
                await ctx.checkpoint(step)
                (folder / f"step-{step}").touch()
        except asyncio.CancelledError:
            (folder / f"cancelled-{ctx.cancelled}-current-{await ctx.is_current()}").touch()
            raise
        return n

    @app.task(name="f.count_sync", timeout_s=300)
    def count_sync(ctx: Context, marks: str, n: int) -> int:
        """Counts to ``n`` in a thread, polling ``ctx.cancelled`` between steps."""
        folder = Path(marks)
        for step in range(1, n + 1):
            if ctx.cancelled:
                (folder / f"saw-cancelled-current-{ctx.is_current_sync()}").touch()
                return step
            time.sleep(STEP_S)
            ctx.checkpoint_sync(step)
            (folder / f"step-{step}").touch()
        return n

    @app.task(name="f.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @app.task(name="f.runs")
    def runs(marks: str) -> int:
        """How many times it ran (a file per run): a rerun returns a larger number."""
        folder = Path(marks)
        done = len(list(folder.glob("run-*"))) + 1
        (folder / f"run-{done}").touch()
        return done

    @app.task(name="f.mark")
    def mark(ctx: Context, marks: str) -> int:
        """Leaves ``ran-<token>``: the side effect that shows a handler ran, and under what."""
        (Path(marks) / f"ran-{ctx.token}").touch()
        return ctx.token

    @app.task(name="f.billing", max_attempts=1)
    async def billing() -> None:
        raise BillingDown("503 from the billing API")

    @app.task(name="f.bad_input", max_attempts=3, retry=FAST_RETRY, permanent_on=(ValueError,))
    async def bad_input() -> None:
        raise ValueError("this input can never work")

    @app.task(name="f.slow", max_attempts=1, timeout_s=0.2)
    async def slow() -> None:
        await asyncio.sleep(30)

    return app


app = make_app()
