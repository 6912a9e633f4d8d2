"""Tasks for the concurrency limit tests, run by real worker processes
(``--app tests.integration.limits_app:app``): jobs that hold their lease for a while."""

from __future__ import annotations

import asyncio

from evsched.client import App
from evsched.settings import Settings

LIMITED = "limited"


def make_app(settings: Settings | None = None) -> App:
    app = App(settings, name="limits")

    @app.task(name="l.sleep", queue=LIMITED, timeout_s=120)
    async def sleep(ms: int) -> int:
        await asyncio.sleep(ms / 1000)
        return ms

    return app


app = make_app()
