"""Tasks for engine scenarios, run by real worker processes (``--app ...scenario_app:app``).

Handlers leave marker files in directories the test names, so a test can tell what a process did
(which attempt, which step) without sleeping on guesses.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from evsched.client import App, Context, RetryPolicy, Snooze
from evsched.settings import Settings

FAST_RETRY = RetryPolicy(initial_backoff_ms=300, max_backoff_ms=1_000, multiplier=2.0, jitter=0.0)


def make_app(settings: Settings | None = None) -> App:
    app = App(settings, name="scenario")

    @app.task(name="s.noop")
    async def noop() -> None:
        return None

    @app.task(name="s.effect")
    async def effect(ctx: Context, tag: str) -> str:
        ctx.effect("mark", {"tag": tag}, key=tag)
        return tag

    @app.task(
        name="s.flaky",
        max_attempts=4,
        retry=FAST_RETRY,
        retry_on=(ConnectionError,),
        permanent_on=(ValueError,),
    )
    async def flaky(ctx: Context, failures: int) -> int:
        if ctx.attempt <= failures:
            raise ConnectionError(f"attempt {ctx.attempt} fails on purpose")
        return ctx.attempt

    @app.task(name="s.permanent", max_attempts=5, retry=FAST_RETRY, permanent_on=(ValueError,))
    async def permanent() -> None:
        raise ValueError("this input can never work")

    @app.task(name="s.always_fail", max_attempts=2, retry=FAST_RETRY)
    async def always_fail() -> None:
        raise ConnectionError("down")

    @app.task(name="s.gated", max_attempts=5, retry=FAST_RETRY, timeout_s=120)
    async def gated(ctx: Context, marks: str, tag: str) -> str:
        """Marks that it started, waits for a ``go`` file, then records an effect."""
        folder = Path(marks)
        (folder / f"started-{ctx.attempt}-{ctx.token}").touch()
        while not (folder / "go").exists():
            await asyncio.sleep(0.05)
        ctx.effect("gated", {"tag": tag}, key=tag)
        (folder / f"finished-{ctx.attempt}-{ctx.token}").touch()
        return tag

    @app.task(name="s.gated_each", max_attempts=5, retry=FAST_RETRY, timeout_s=120)
    async def gated_each(ctx: Context, marks: str, tag: str) -> str:
        """Like ``s.gated``, but each token waits for a ``go-<token>`` file of its own."""
        folder = Path(marks)
        (folder / f"started-{ctx.attempt}-{ctx.token}").touch()
        while not (folder / f"go-{ctx.token}").exists():
            await asyncio.sleep(0.05)
        ctx.effect("gated", {"tag": tag, "token": ctx.token}, key=tag)
        (folder / f"finished-{ctx.attempt}-{ctx.token}").touch()
        return tag

    @app.task(name="s.count", max_attempts=5, retry=FAST_RETRY, timeout_s=120)
    async def count(ctx: Context, marks: str, n: int) -> int:
        """Counts to ``n``, checkpointing each step; a re-run resumes after the last checkpoint."""
        folder = Path(marks)
        start = int(ctx.last_checkpoint or 0) + 1
        for step in range(start, n + 1):
            await asyncio.sleep(0.15)
            await ctx.checkpoint(step)
            (folder / f"a{ctx.attempt}-s{step}").touch()
        ctx.effect("counted", {"n": n})
        return n

    @app.task(name="s.plus", max_attempts=4, retry=FAST_RETRY, retry_on=(ConnectionError,))
    async def plus(ctx: Context, add: int, failures: int, previous: int = 0) -> int:
        """A workflow step: ``previous`` (the parent's result, appended) plus ``add``."""
        if ctx.attempt <= failures:
            raise ConnectionError(f"attempt {ctx.attempt} fails on purpose")
        return previous + add

    @app.task(name="s.total")
    async def total(results: list[int]) -> int:
        """A group's callback: the sum of its members' results, checked to be in member order."""
        return sum(results)

    @app.task(name="s.snooze", max_attempts=1)
    def snooze(ctx: Context, marks: str, times: int, delay_s: float) -> int | Snooze:
        """Snoozes ``times`` times (raising the first, returning the others), then succeeds;
        each run leaves ``run-<n>-attempt-<attempt>-token-<token>``."""
        folder = Path(marks)
        done = len(list(folder.glob("run-*")))
        (folder / f"run-{done + 1}-attempt-{ctx.attempt}-token-{ctx.token}").touch()
        if done == 0 and times > 0:
            raise Snooze(delay_s, reason=f"snooze {done + 1} of {times}")
        if done < times:
            return Snooze(delay_s, reason=f"snooze {done + 1} of {times}")
        return done

    @app.task(name="s.snooze_capped", max_attempts=2, retry=FAST_RETRY, max_snoozes=1)
    async def snooze_capped() -> Snooze:
        """Snoozes for ever: past its cap of one, each snooze is a failed attempt."""
        return Snooze(0.2, reason="never ready")

    return app


app = make_app()
