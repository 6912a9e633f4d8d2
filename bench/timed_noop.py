"""The evsched app of the side-by-side benchmark: e2e's no-op and a no-op that notes its start.

The workers serve it as ``timed_noop:app`` (run from this folder); importing it defines the app
and nothing else.
"""

from __future__ import annotations

from e2e import define_noop
from evsched.client import App, Task
from starts import record

TIMED_NAME = "bench.timed_noop"


def define_timed(target: App) -> Task:
    @target.task(name=TIMED_NAME, max_attempts=3)
    async def timed_noop(tag: str, run_at_ms: int) -> None:
        """Does nothing but note when it started, as Celery's twin does."""
        record(tag, run_at_ms)

    return timed_noop


app = App(name="bench")
define_noop(app)
define_timed(app)
