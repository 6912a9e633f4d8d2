"""The task of the priority scenario (``--app tests.integration.priority_app:app``): a handler
slow enough that a backlog builds up behind a worker's few slots."""

from __future__ import annotations

import asyncio

from evsched.client import App
from evsched.settings import Settings


def make_app(settings: Settings | None = None) -> App:
    app = App(settings, name="priority")

    @app.task(name="p.slow", timeout_s=60)
    async def slow(seconds: float) -> None:
        await asyncio.sleep(seconds)

    return app


app = make_app()
