"""Tasks for the node's hardening scenarios (``--app tests.integration.node_app:app``)."""

from __future__ import annotations

import asyncio

from evsched.adapters.kafka.queues import QueueCatalog
from evsched.client import App, Context
from evsched.settings import Settings


def make_app(settings: Settings | None = None, queues: QueueCatalog | None = None) -> App:
    app = App(settings, name="node-scenarios", queues=queues)

    @app.task(name="n.sleep", max_attempts=1, timeout_s=60)
    async def sleep(seconds: float) -> None:
        """Slow work with one attempt: a lease that expires before its start kills the job."""
        await asyncio.sleep(seconds)

    @app.task(name="n.effect", max_attempts=1)
    async def effect(ctx: Context, size: int) -> None:
        ctx.effect("blob", {"pad": "x" * size})

    @app.task(name="n.fresh", queue="fresh", max_attempts=1)
    async def fresh() -> None:
        return None

    @app.task(name="n.misconfigured", queue="misconfigured", max_attempts=1)
    async def misconfigured() -> None:
        return None

    @app.task(name="n.tiny", queue="tiny", max_attempts=1)
    async def tiny(pad: str) -> None:
        return None

    return app


app = make_app()
