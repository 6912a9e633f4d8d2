"""Tasks the browser tests' worker processes run (``--app tests.browser.browser_app:app``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from evsched.client import App, Context, RetryPolicy
from evsched.settings import Settings

FAST_RETRY = RetryPolicy(initial_backoff_ms=300, max_backoff_ms=1_000, multiplier=2.0, jitter=0.0)


def make_app(settings: Settings | None = None) -> App:
    app = App(settings, name="browser")

    @app.task(name="b.work", queue="bulk", max_attempts=10, retry=FAST_RETRY)
    async def work(ctx: Context, n: int, marks: str, hold: bool) -> int:
        """A short job; a held one also waits for a ``go`` file in ``marks`` (a worker can
        then be killed while it surely runs some)."""
        await asyncio.sleep(0.05)
        while hold and not (Path(marks) / "go-bulk").exists():
            await asyncio.sleep(0.05)
        ctx.effect("worked", {"n": n}, key=str(n))
        return n

    @app.task(name="b.flaky", max_attempts=3, retry=FAST_RETRY, retry_on=(ConnectionError,))
    async def flaky(ctx: Context) -> int:
        if ctx.attempt == 1:
            raise ConnectionError("the first attempt fails on purpose")
        return ctx.attempt

    @app.task(name="b.until", max_attempts=1, permanent_on=(ValueError,))
    async def until(marks: str) -> str:
        """Dies until the test writes a ``go`` file into ``marks``."""
        if not (Path(marks) / "go").exists():
            raise ValueError("not yet: no go file")
        return "went"

    return app


app = make_app()
