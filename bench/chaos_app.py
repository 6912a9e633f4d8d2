"""The tasks the chaos soak's workers run (``evsched worker --app chaos_app:app`` from bench/).

Every task that succeeds records one effect, so the effects topic shows each accepted success;
``flaky`` fails its first ``failures`` attempts (transient), ``broken`` always fails for good.
Importing this module must stay free of side effects beyond defining the app.
"""

from __future__ import annotations

from evsched.client import App, Context, RetryPolicy, Task

QUEUE = "default"
FAST_RETRY = RetryPolicy(initial_backoff_ms=200, max_backoff_ms=2_000, multiplier=2.0, jitter=0.1)


class Transient(ConnectionError):
    """A failure worth retrying."""


class Broken(ValueError):
    """A failure no retry can fix."""


def define(target: App) -> dict[str, Task]:
    """The soak's tasks on ``target`` (the workers' app or the load generator's client)."""

    @target.task(name="chaos.noop", queue=QUEUE, max_attempts=5, retry=FAST_RETRY)
    async def noop(ctx: Context) -> None:
        ctx.effect("done", {"attempt": ctx.attempt})

    @target.task(
        name="chaos.flaky",
        queue=QUEUE,
        max_attempts=5,
        retry=FAST_RETRY,
        retry_on=(Transient,),
        permanent_on=(Broken,),
    )
    async def flaky(ctx: Context, failures: int) -> int:
        if ctx.attempt <= failures:
            raise Transient(f"attempt {ctx.attempt} fails on purpose")
        ctx.effect("done", {"attempt": ctx.attempt})
        return ctx.attempt

    @target.task(
        name="chaos.broken", queue=QUEUE, max_attempts=5, retry=FAST_RETRY, permanent_on=(Broken,)
    )
    async def broken() -> None:
        raise Broken("this input can never work")

    return {"noop": noop, "flaky": flaky, "broken": broken}


app = App(name="chaos")
define(app)
